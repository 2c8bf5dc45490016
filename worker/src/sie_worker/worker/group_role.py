"""This worker's part in a group of nodes (``SIE_NODES``, ``SIE_NODE_RANK``,
``SIE_LEADER_ADDRESS``): which models the group serves, who serves requests, and what a
rank's engine exiting does.

- A group model is one wider than this worker's devices (tensor x pipeline width); every
  rank runs one rank of its engine (:mod:`~sie_worker.worker.launcher.ranks`), pinned.
- Rank 0 serves requests as any worker does. Ranks >= 1 answer every inference and model
  request with 409 ``not_leader`` naming the leader, keep only the group models pinned, and
  their ``/readyz`` says their rank.
- A group model's engine exiting on any rank, or failing to start, ends that rank's worker
  with :data:`GROUP_EXIT_STATUS` (after the usual drain and engine stops), so the group's
  pods restart together (LeaderWorkerSet ``RecreateGroupOnPodRestart``): a rank cannot
  rejoin a running group's rendezvous alone.
- Each rank watches the other ranks' workers (:mod:`~sie_worker.worker.group_watch`): a
  peer gone ends this worker the same way, its group engines stopped first so that requests
  in flight get an error instead of waiting on an engine that lost its peer.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable

from sie_worker.config.load.load_options import declared_width
from sie_worker.config.model import ServedModel
from sie_worker.config.widths import width_fits
from sie_worker.errors import NotLeader
from sie_worker.settings import Settings
from sie_worker.worker.group_peers import peer_urls

__all__ = ["GROUP_EXIT_STATUS", "GroupRole"]

GROUP_EXIT_STATUS = 3
_log = logging.getLogger("sie_worker.manager")


def _stop_server() -> None:
    # The server's own SIGTERM path: drain, stop engines, then `serve` exits with the status.
    signal.raise_signal(signal.SIGTERM)


class GroupRole:
    def __init__(self, settings: Settings, stop: Callable[[], None] = _stop_server) -> None:
        self.nodes = settings.nodes
        self.rank = settings.node_rank
        self.leader = settings.leader_address
        self._devices = len(settings.devices)
        self._stop = stop
        self.exit_status = 0
        # The other ranks' workers; None: not known (no SIE_NODE_ADDRESSES, no LWS name).
        self.peers = peer_urls(settings)

    @property
    def grouped(self) -> bool:
        return self.nodes >= 2

    @property
    def leads(self) -> bool:
        return self.rank == 0

    def serves_group(self, served: ServedModel) -> bool:
        """Whether the group serves this model (it is wider than this worker's devices)."""
        return self.grouped and not width_fits(declared_width(served), self._devices)

    def require_leader(self) -> None:
        """Raise :class:`NotLeader` on a rank >= 1."""
        if not self.leads:
            raise NotLeader(self.rank, self.nodes, self.leader or "")

    def keeps_pinned(self, served: ServedModel) -> bool:
        """Ranks >= 1 serve nobody: they keep only the group's models loaded."""
        return self.leads or self.serves_group(served)

    def probe_fields(self) -> dict[str, object]:
        """What ``/readyz`` adds on a rank of a group."""
        if not self.grouped:
            return {}
        return {"rank": self.rank, "nodes": self.nodes, "leader": self.leader}

    def engine_failed(self, model_id: str, why: str) -> None:
        """A group model's engine rank ended or failed to start: end this worker."""
        self._end(f"{model_id}: rank {self.rank} of the group's engine ended ({why})")

    def peer_lost(self, rank: int, why: str) -> None:
        """Another rank's worker is gone (:mod:`~sie_worker.worker.group_watch`): end this
        worker."""
        self._end(f"rank {self.rank} lost rank {rank} of the group ({why})")

    def _end(self, what: str) -> None:
        if self.exit_status:
            return
        self.exit_status = GROUP_EXIT_STATUS
        _log.error(
            "%s; stopping this worker with status %d so the group restarts whole",
            what,
            GROUP_EXIT_STATUS,
        )
        self._stop()
