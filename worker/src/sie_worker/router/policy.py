"""The slot router's routing decision: pure functions over a snapshot of the pod's slots.

For a request naming ``model`` the router picks, among slots that answer:

1. ``ready``: a slot where the model is ready, the one with the least outstanding requests;
2. ``loading``: a slot where it is loading (least outstanding);
3. ``free_device``: a slot with a contiguous run of free devices as wide as the model
   (least outstanding);
4. ``evict_lru``: the slot whose least recently used unpinned, idle model has been idle
   longest (the worker then evicts it);
5. ``wait``: nothing can be evicted yet but a model is loading somewhere: the router holds
   the request until a slot's state changes and decides again (``slot`` is where it would
   go if it cannot wait), instead of queueing a second switch behind a load;
6. ``least_outstanding``: otherwise the least busy slot, whose worker gives the answer
   (for example ``placement_failed`` when only pinned models hold its devices).

Before all of these, :func:`choose_by_prefix` (``prefix``): the slot holding the longest
prefix of the request's prompt, as the router's prefix index found it (ties: the one sent it
most recently), as long as the model is ready or loading there and one more request keeps
the slot within the load bound (:mod:`sie_worker.backends.bound`).

Ties go to the lowest slot index, so a decision never depends on the order of the input.
:func:`record_dispatch` applies a decision to a snapshot optimistically, so a burst of
requests for one model follows the first one to the same slot and loads it once.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from sie_worker.backends.bound import load_cap, within_bound
from sie_worker.backends.lora_affinity import adapter_miss
from sie_worker.backends.prefix import PrefixPick
from sie_worker.model_states import ModelState
from sie_worker.router.tiers import (
    TIERS,
    evictable,
    free_run,
    idle_key,
    shared_device,
    slot_idle_key,
)

__all__ = [
    "REASONS",
    "Decision",
    "ModelView",
    "Reason",
    "SlotView",
    "choose_by_prefix",
    "choose_slot",
    "free_run",
    "record_dispatch",
    "record_served",
]

Reason = Literal[
    "ready",
    "loading",
    "free_device",
    "evict_lru",
    "wait",
    "least_outstanding",
    "named_slot",
    "prefix",
]
# Reasons a request is finally sent for (``wait`` is never a final decision).
REASONS: tuple[Reason, ...] = (
    "ready",
    "loading",
    "free_device",
    "evict_lru",
    "least_outstanding",
    "named_slot",
    "prefix",
)


@dataclass(frozen=True)
class ModelView:
    """One model as one slot's worker reports it (``/v1/models``), plus the router's count."""

    state: ModelState = "unloaded"
    width: int = 1
    pinned: bool = False
    last_used: float | None = None  # unix seconds; None when the worker does not say
    inflight: int = 0  # requests on this model now (worker's or router's count, the larger)
    memory_bytes: int | None = None  # what it reserves on each device, as the worker says
    adapters: frozenset[str] = frozenset()  # its LoRA adapters the worker serves now


@dataclass(frozen=True)
class SlotView:
    """One slot (one worker): whether it answers, its devices in order, its models."""

    index: int
    up: bool = True
    outstanding: int = 0  # requests the router has sent to this slot and not yet finished
    devices: tuple[tuple[str, str | None], ...] = ()  # (device, model holding it or None)
    models: Mapping[str, ModelView] = field(default_factory=dict)
    # Memory each device has left, in ``devices`` order, as the worker reports it (its budget
    # less what its models reserve); None, or no entry: not known (a device takes one model).
    room: tuple[int | None, ...] = ()

    def state_of(self, model: str) -> ModelState:
        view = self.models.get(model)
        return view.state if view is not None else "unloaded"

    def adapters_of(self, model: str) -> frozenset[str]:
        view = self.models.get(model)
        return view.adapters if view is not None else frozenset()


@dataclass(frozen=True)
class Decision:
    slot: int
    reason: Reason


def choose_slot(
    model: str,
    slots: Sequence[SlotView],
    adapter: str | None = None,
    *,
    exclude: Collection[int] = (),
) -> Decision | None:
    """Pick the slot for a request naming ``model`` (and LoRA ``adapter``); None when no
    slot answers. Filter (answering, not excluded), score (the first tier of
    :data:`~sie_worker.router.tiers.TIERS` some slot is in), pick (least outstanding, the
    adapter's slots first; for ``evict_lru`` the idlest victim)."""
    candidates = [s for s in slots if s.up and s.index not in exclude]
    if not candidates:
        return None
    for tier, holds in TIERS:
        best = [s for s in candidates if holds(model, s)]
        if not best:
            continue
        if tier == "evict_lru":
            victim = min(best, key=lambda s: (slot_idle_key(s), s.outstanding, s.index))
            return Decision(victim.index, tier)
        return Decision(_least_outstanding(best, model, adapter), tier)
    fallback = _least_outstanding(candidates, model, None)
    if any(v.state == "loading" for s in candidates for v in s.models.values()):
        return Decision(fallback, "wait")
    return Decision(fallback, "least_outstanding")


def choose_by_prefix(
    model: str, slots: Sequence[SlotView], pick: PrefixPick, *, exclude: Collection[int] = ()
) -> Decision | None:
    """The slot holding the longest cached prefix (``pick``: asks the prefix index for the
    best of the slots it may use, by index) among those within the load bound with ``model``
    ready or loading (its cache went with the model otherwise); None: the usual order."""
    candidates = [s for s in slots if s.up and s.index not in exclude]
    if not candidates:
        return None
    cap = load_cap(sum(s.outstanding for s in candidates), len(candidates))
    eligible = {
        s.index
        for s in candidates
        if within_bound(s.outstanding, cap) and s.state_of(model) in ("ready", "loading")
    }
    found = pick(eligible) if eligible else None
    return Decision(found, "prefix") if isinstance(found, int) else None


def record_dispatch(slot: SlotView, model: str) -> SlotView:
    """The slot as it will be once its worker starts loading ``model`` (optimistic).

    Unchanged when the model is already ready or loading there, or when the worker does not
    list the model (it will answer ``unknown_model``; nothing to record). Otherwise the model
    becomes ``loading`` on the first free run wide enough, evicting idle unpinned models in
    least-recently-used order until one is.
    """
    view = slot.models.get(model)
    if view is None or view.state in ("ready", "loading"):
        return slot
    shared = shared_device(view, slot)
    if shared is not None:
        # Beside what is there (the worker shares a device among width-1 models whose
        # memory fits): nothing is evicted, the device has that much less left.
        room = list(slot.room)
        room[shared] = (room[shared] or 0) - (view.memory_bytes or 0)
        return replace(
            slot, room=tuple(room), models={**slot.models, model: replace(view, state="loading")}
        )
    models = dict(slot.models)
    devices = list(slot.devices)
    victims = sorted(
        (m for m, v in models.items() if evictable(v) and m != model),
        key=lambda m: (idle_key(models[m]), m),
    )
    while free_run(devices) < view.width and victims:
        victim = victims.pop(0)
        models[victim] = replace(models[victim], state="unloaded", inflight=0)
        devices = [(d, None if held == victim else held) for d, held in devices]
    start = _run_start(devices, view.width)
    if start is not None:
        for i in range(start, start + view.width):
            devices[i] = (devices[i][0], model)
    models[model] = replace(view, state="loading")
    return replace(slot, devices=tuple(devices), models=models)


def record_served(slot: SlotView, model: str) -> SlotView:
    """The slot once its worker has answered a request for ``model`` successfully: ready."""
    view = slot.models.get(model)
    if view is None or view.state == "ready":
        return slot
    if view.state != "loading":
        slot = record_dispatch(slot, model)
        view = slot.models[model]
    return replace(slot, models={**slot.models, model: replace(view, state="ready")})


def _run_start(devices: Sequence[tuple[str, str | None]], width: int) -> int | None:
    current = 0
    for i, (_, held) in enumerate(devices):
        current = current + 1 if held is None else 0
        if current >= width:
            return i - width + 1
    return None


def _least_outstanding(slots: Iterable[SlotView], model: str, adapter: str | None) -> int:
    """The least outstanding slot, those that serve ``adapter`` now first."""
    if adapter is None:
        return min(slots, key=lambda s: (s.outstanding, s.index)).index
    return min(
        slots, key=lambda s: (adapter_miss(s.adapters_of(model), adapter), s.outstanding, s.index)
    ).index
