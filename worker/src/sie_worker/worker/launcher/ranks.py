"""One rank of a model that a group of nodes serves: its rendezvous port. Pure.

A model wider than one worker's devices is served by every worker of the group
(``SIE_NODES``), each running one rank of its engine on width / N of its devices. Every
rank must find the same rendezvous port without asking anyone: ``nccl_port`` when the
config declares it, else :data:`GROUP_PORT_BASE` + the model's index in ``SIE_PINNED_MODELS``
(the same list on every rank; a group model is always pinned). Rank 0, at
``SIE_LEADER_ADDRESS``, listens on it; the other ranks join it. Each engine family spells its
multi-node flags itself (:meth:`~sie_worker.engines.family.EngineFamily.rank_args`).
"""

from __future__ import annotations

from dataclasses import dataclass

from sie_worker.settings import Settings

__all__ = ["GROUP_PORT_BASE", "GroupRank", "group_port", "group_rank"]

GROUP_PORT_BASE = 30400


@dataclass(frozen=True)
class GroupRank:
    """This worker's rank of one group model's engine."""

    nodes: int
    rank: int
    leader: str  # rank 0's host
    port: int  # the rendezvous port, on the leader

    @property
    def leads(self) -> bool:
        return self.rank == 0


def group_port(model_id: str, declared: int | None, pinned: tuple[str, ...]) -> int:
    """The group's rendezvous port for ``model_id``: the declared ``nccl_port``, else
    :data:`GROUP_PORT_BASE` + its index among the pinned models (appended when absent)."""
    if declared is not None:
        return declared
    index = pinned.index(model_id) if model_id in pinned else len(pinned)
    return GROUP_PORT_BASE + index


def group_rank(model_id: str, declared: int | None, settings: Settings) -> GroupRank:
    """This worker's rank of ``model_id``'s group engine (``settings`` name a group)."""
    if settings.nodes < 2 or settings.leader_address is None:
        raise ValueError(f"{model_id}: this worker is no rank of a group (SIE_NODES unset)")
    return GroupRank(
        nodes=settings.nodes,
        rank=settings.node_rank,
        leader=settings.leader_address,
        port=group_port(model_id, declared, settings.pinned_models),
    )
