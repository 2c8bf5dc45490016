"""The gateway's routing decision: pure functions over a snapshot of the pools' pods,
composed as filter -> score -> pick from one small module each: the fit filter (slots as
wide as the model, :mod:`sie_worker.config.widths`), the tier scorer
(:mod:`sie_worker.gateway.tiers`), the load-bound filter (:mod:`sie_worker.backends.bound`,
the router's too), the session scorer (:mod:`sie_worker.backends.session`) and the prefix
pick (:mod:`sie_worker.backends.prefix`, the router's too).

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
   (ties: name). So a hot model spreads to idle pods only once its pods are busy.
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
from sie_worker.backends.prefix import PrefixPick
from sie_worker.backends.session import rendezvous_order, session_score
from sie_worker.config.widths import width_fits
from sie_worker.gateway.tiers import TIERS, tier_of

__all__ = [
    "BALANCE_FACTOR",
    "REASONS",
    "Decision",
    "GroupView",
    "PodLike",
    "PodView",
    "Reason",
    "choose",
    "fits",
    "load_cap",
    "rendezvous_order",
    "tier_of",
]  # fits, rendezvous_order and tier_of: the parts, re-exported for the tests and the bench

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


@dataclass(frozen=True)
class PodView:
    name: str
    up: bool = True
    slots: int = 1
    outstanding: int = 0
    models: Mapping[str, str] = field(default_factory=dict)
    free_run: int = 0
    slot_width: int = 8  # unless said otherwise, as wide as any model (8 GPUs)


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
) -> Decision | None:
    """The pod for one request, or None when no group has a candidate (hold the request)."""
    # Filter (up, not excluded, wide enough) and score (tier, load bound) in one pass per
    # group, each candidate once; then pick: prefix, else least outstanding or the session's
    # rendezvous order in the best group's best tier.
    cached: set[tuple[Hashable, str]] = set()  # where the prefix rule may send it
    best_rank: tuple[int, float, int] | None = None
    best: tuple[GroupView, list[tuple[PodLike, int, bool]]] | None = None
    for group in groups:
        if exclude:
            candidates = [
                p
                for p in group.pods
                if p.up and width_fits(width, p.slot_width) and p.name not in exclude
            ]
        else:
            candidates = [p for p in group.pods if p.up and width_fits(width, p.slot_width)]
        if not candidates:
            continue
        total = 0
        slots = 0
        for p in candidates:
            total += p.outstanding
            slots += p.slots
        cap = load_cap(total, len(candidates), factor)
        rated: list[tuple[PodLike, int, bool]] = []
        tier = 4
        for p in candidates:
            fit = within_bound(p.outstanding, cap, slots=p.slots, slot_target=slot_target)
            t = tier_of(p, model, width)
            rated.append((p, t, fit))
            if fit and t < tier:
                tier = t
            if prefix is not None and fit and t <= 1:
                cached.add((group.key, p.name))
        rank = (tier, total / slots, group.order)
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
            (p for p, t, fit in rated if t == tier and fit), key=lambda p: (p.outstanding, p.name)
        )
        return Decision(group.key, pod.name, TIERS[tier])
    # The key's rendezvous order, among pods of the chosen tier or better only.
    ranked = sorted(
        ((-session_score(session, p.name), p.name, t, fit) for p, t, fit in rated if t <= tier)
    )
    skipped = False  # a pod at least as good came first in the session's order, but was full
    for _, name, t, fit in ranked:
        if t == tier and fit:
            return Decision(group.key, name, "affinity_spill" if skipped else "affinity")
        skipped = True
    raise AssertionError("unreachable: the chosen tier has a fitting pod")


def fits(pod: PodLike, cap: int, slot_target: int) -> bool:
    """The load-bound filter for a pod (:func:`~sie_worker.backends.bound.within_bound`)."""
    return within_bound(pod.outstanding, cap, slots=pod.slots, slot_target=slot_target)
