"""The gateway's routing decision: pure functions over a snapshot of the pools' pods.

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

import hashlib
from collections.abc import Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from sie_worker.backends.bound import BALANCE_FACTOR, load_cap
from sie_worker.backends.prefix import PrefixPick
from sie_worker.config.widths import width_fits

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
]

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
_TIERS: tuple[Reason, ...] = ("ready", "loading", "free_slot", "least_outstanding")


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


def tier_of(pod: PodLike, model: str, width: int) -> int:
    """0 ready, 1 loading, 2 free slot, 3 anything else."""
    state = pod.models.get(model)
    if state == "ready":
        return 0
    if state == "loading":
        return 1
    if pod.free_run >= width:
        return 2
    return 3


def fits(pod: PodLike, cap: int, slot_target: int) -> bool:
    """Within the load bound: below ``slot_target`` per slot, or one more within ``cap``."""
    return pod.outstanding < pod.slots * slot_target or pod.outstanding + 1 <= cap


def rendezvous_order(key: str, names: Collection[str]) -> list[str]:
    """``names`` ordered by ``hash(key, name)``, highest first (rendezvous hashing)."""
    return sorted(names, key=lambda name: (-_score(key, name), name))


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
    # One pass per group: each candidate's tier and fit are computed once.
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
            fit = fits(p, cap, slot_target)
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
        return Decision(group.key, pod.name, _TIERS[tier])
    # The key's rendezvous order, among pods of the chosen tier or better only.
    ranked = sorted(
        ((-_score(session, p.name), p.name, t, fit) for p, t, fit in rated if t <= tier)
    )
    skipped = False  # a pod at least as good came first in the session's order, but was full
    for _, name, t, fit in ranked:
        if t == tier and fit:
            return Decision(group.key, name, "affinity_spill" if skipped else "affinity")
        skipped = True
    raise AssertionError("unreachable: the chosen tier has a fitting pod")


def _score(key: str, name: str) -> int:
    digest = hashlib.blake2b(f"{key}\0{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")
