"""The gateway's routing decision: pure functions over a snapshot of the pools' pods,
composed as filter -> score -> pick from one small module each: the fit filter (slots as
wide as the model, :mod:`sie_worker.config.widths`), the tier scorer
(:mod:`sie_worker.gateway.tiers`), the load-bound filter (:mod:`sie_worker.backends.bound`,
the router's too), the session scorer (:mod:`sie_worker.backends.session`), the prefix
pick (:mod:`sie_worker.backends.prefix`, the router's too) and the LoRA affinity scorer
(:mod:`sie_worker.backends.lora_affinity`, the router's too).

A request for ``model`` that may go to the pool x bundles ``groups`` (already filtered by
the request's headers and by what each pool can serve) goes to one pod. Each pod is a tier
for the model: ``ready`` (a slot has it ready), ``loading``, ``free_slot`` (a slot has a
contiguous run of free GPUs as wide as the model), else ``least_outstanding`` (its router
evicts or queues). Pods that answer, are not excluded and whose slots are as wide as the
model are candidates (a narrower slot refuses the model with ``invalid_config``).

Load bound (consistent hashing with bounded loads, Mirrokni et al.; HAProxy's
``hash-balance-factor``): a pod *fits* while its in-flight requests stay below
``slot_target`` per serving slot, or while one more keeps it within ``ceil(1.25 x (the
group's in-flight + 1) / candidates)``. The least loaded candidate always fits.

1. Group: the one whose best fitting pod has the best tier, then the lower in-flight per
   slot, then the earlier entry of the pools file.
2. Pod, without a session key: the first tier in ``ready, loading, free_slot,
   least_outstanding`` order that has a fitting pod, and there the least outstanding pod
   (ties: name), the pods that serve the request's LoRA adapter now first. So a hot model
   spreads to idle pods only once its pods are busy.
3. Pod, with a session key (``X-Session-Id``, ``user``, ...): the same tiers, but within the
   tier the first fitting pod in the key's rendezvous-hash order (highest
   ``hash(key, pod)`` first): a session sticks to one pod, moves only when that pod is
   over the bound or gone, and only a share ``1/n`` of sessions moves when a pod joins.
   The reason is ``affinity``, or ``affinity_spill`` when a pod of that tier or a better
   one came first in the key's order but was over the bound.
4. Before 2, without a session key: ``prefix``, the pod (of any group) holding the longest
   prefix of the request's prompt (``prefix``: asks the gateway's prefix index for the best
   of the pods it may use, by ``(group key, pod name)``; ties: the one sent it most
   recently) among those that fit and have the model ready or loading (its cache lives
   with the model).

None of it depends on the order of the input; ties go to the lowest name.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from sie_worker.backends.bound import BALANCE_FACTOR, load_cap, within_bound
from sie_worker.backends.lora_affinity import adapter_miss
from sie_worker.backends.prefix import PrefixPick
from sie_worker.backends.session import session_score
from sie_worker.config.widths import width_fits
from sie_worker.gateway.tiers import TIERS, tier_of

__all__ = ["REASONS", "Decision", "GroupView", "PodLike", "PodView", "Reason", "choose"]

Reason = Literal[
    "ready", "loading", "free_slot", "least_outstanding", "affinity", "affinity_spill", "prefix"
]
REASONS: tuple[Reason, ...] = (
    "ready",
    "loading",
    "free_slot",
    "least_outstanding",
    "affinity",
    "affinity_spill",
    "prefix",
)


class PodLike(Protocol):
    """What the policy reads of a pod (the gateway's live pod state, or a :class:`PodView`)."""

    @property
    def name(self) -> str: ...
    @property
    def up(self) -> bool: ...
    @property
    def slots(self) -> int: ...
    @property
    def outstanding(self) -> int: ...
    @property
    def models(self) -> Mapping[str, str]: ...  # model -> unloaded | loading | ready | failed
    @property
    def free_run(self) -> int: ...  # widest run of free GPUs within one slot
    @property
    def slot_width(self) -> int: ...  # GPUs of its widest slot: the widest model it takes
    @property
    def adapters(self) -> Mapping[str, frozenset[str]]: ...  # model -> LoRA adapters served


@dataclass(frozen=True)
class PodView:
    name: str
    up: bool = True
    slots: int = 1
    outstanding: int = 0
    models: Mapping[str, str] = field(default_factory=dict)
    free_run: int = 0
    slot_width: int = 8  # unless said otherwise, as wide as any model (8 GPUs)
    adapters: Mapping[str, frozenset[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class GroupView:
    """One pool x bundle: ``key`` identifies it, ``order`` is its place in the pools file."""

    key: Hashable
    order: int
    pods: Sequence[PodLike]


@dataclass(frozen=True)
class Decision:
    group: Hashable
    pod: str
    reason: Reason


def choose(
    model: str,
    width: int,
    groups: Sequence[GroupView],
    *,
    session: str | None = None,
    exclude: Collection[str] = (),
    slot_target: int = 4,
    factor: float = BALANCE_FACTOR,
    prefix: PrefixPick | None = None,
    adapter: str | None = None,
) -> Decision | None:
    """The pod for one request, or None when no group has a candidate (hold the request)."""
    # Filter and score each group's candidates (each once), then pick: prefix, else least
    # outstanding or the session's rendezvous order in the best group's best tier.
    cached: set[tuple[Hashable, str]] = set()  # where the prefix rule may send it
    best_rank: tuple[int, float, int] | None = None
    best: tuple[GroupView, list[_Rated]] | None = None
    for group in groups:
        rated, tier, load = _rate(
            _candidates(group, width, exclude), model, width, slot_target, factor
        )
        if not rated:
            continue
        if prefix is not None:
            cached.update((group.key, p.name) for p, t, fit in rated if fit and t <= 1)
        rank = (tier, load, group.order)
        if best_rank is None or rank < best_rank:
            best_rank, best = rank, (group, rated)
    if best is None or best_rank is None:
        return None
    if prefix is not None and cached and session is None:
        found = prefix(cached)
        if found is not None:
            assert isinstance(found, tuple)
            return Decision(found[0], found[1], "prefix")
    group, rated = best
    tier = best_rank[0]
    if session is None:
        pod = min(
            (p for p, t, fit in rated if t == tier and fit),
            key=lambda p: (adapter_miss(p.adapters.get(model, ()), adapter), p.outstanding, p.name),
        )
        return Decision(group.key, pod.name, TIERS[tier])
    return _by_session(group.key, rated, tier, session)


# A candidate, its tier (gateway.tiers) and whether it is within the load bound.
_Rated = tuple[PodLike, int, bool]


def _candidates(group: GroupView, width: int, exclude: Collection[str]) -> list[PodLike]:
    """The filter: pods that answer, are not excluded and whose slots are wide enough
    (:func:`~sie_worker.config.widths.width_fits`)."""
    if exclude:
        return [
            p
            for p in group.pods
            if p.up and width_fits(width, p.slot_width) and p.name not in exclude
        ]
    return [p for p in group.pods if p.up and width_fits(width, p.slot_width)]


def _rate(
    candidates: Sequence[PodLike], model: str, width: int, slot_target: int, factor: float
) -> tuple[list[_Rated], int, float]:
    """The scores: each candidate's tier and load-bound fit; the group's best fitting tier
    and its in-flight requests per slot."""
    if not candidates:
        return [], 4, 0.0
    total = sum(p.outstanding for p in candidates)
    slots = sum(p.slots for p in candidates)
    cap = load_cap(total, len(candidates), factor)
    rated: list[_Rated] = []
    tier = 4
    for p in candidates:
        fit = within_bound(p.outstanding, cap, slots=p.slots, slot_target=slot_target)
        t = tier_of(p, model, width)
        rated.append((p, t, fit))
        if fit and t < tier:
            tier = t
    return rated, tier, total / slots


def _by_session(group: Hashable, rated: Sequence[_Rated], tier: int, session: str) -> Decision:
    """The pick with a session key: the key's rendezvous order, among pods of the chosen
    tier or better only (:mod:`sie_worker.backends.session`)."""
    ranked = sorted(
        ((-session_score(session, p.name), p.name, t, fit) for p, t, fit in rated if t <= tier)
    )
    skipped = False  # a pod at least as good came first in the session's order, but was full
    for _, name, t, fit in ranked:
        if t == tier and fit:
            return Decision(group, name, "affinity_spill" if skipped else "affinity")
        skipped = True
    raise AssertionError("unreachable: the chosen tier has a fitting pod")
