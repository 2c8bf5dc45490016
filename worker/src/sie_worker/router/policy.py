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
from sie_worker.backends.prefix import PrefixPick
from sie_worker.model_states import ModelState

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


@dataclass(frozen=True)
class Decision:
    slot: int
    reason: Reason


def choose_slot(
    model: str, slots: Sequence[SlotView], *, exclude: Collection[int] = ()
) -> Decision | None:
    """Pick the slot for a request naming ``model``; None when no slot answers."""
    candidates = [s for s in slots if s.up and s.index not in exclude]
    if not candidates:
        return None
    for state in ("ready", "loading"):
        holding = [s for s in candidates if s.state_of(model) == state]
        if holding:
            return Decision(_least_outstanding(holding), state)
    fits = [s for s in candidates if _fits_now(model, s)]
    if fits:
        return Decision(_least_outstanding(fits), "free_device")
    evictable = [(key, s) for s in candidates if (key := _slot_idle_key(s)) is not None]
    if evictable:
        best = min(evictable, key=lambda pair: (pair[0], pair[1].outstanding, pair[1].index))
        return Decision(best[1].index, "evict_lru")
    fallback = _least_outstanding(candidates)
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
    shared = _shared_device(view, slot)
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
        (m for m, v in models.items() if _evictable(v) and m != model),
        key=lambda m: (_idle_key(models[m]), m),
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


def free_run(devices: Iterable[tuple[str, str | None]]) -> int:
    """Length of the longest contiguous run of free devices."""
    longest = current = 0
    for _, held in devices:
        current = current + 1 if held is None else 0
        longest = max(longest, current)
    return longest


def _run_start(devices: Sequence[tuple[str, str | None]], width: int) -> int | None:
    current = 0
    for i, (_, held) in enumerate(devices):
        current = current + 1 if held is None else 0
        if current >= width:
            return i - width + 1
    return None


def _least_outstanding(slots: Iterable[SlotView]) -> int:
    return min(slots, key=lambda s: (s.outstanding, s.index)).index


def _width(model: str, slot: SlotView) -> int:
    view = slot.models.get(model)
    return view.width if view is not None else 1


def _fits_now(model: str, slot: SlotView) -> bool:
    """A run of free devices as wide as the model, or, for a width-1 model whose memory the
    worker reports, a device with that much memory left (the worker's sharing rule)."""
    if free_run(slot.devices) >= _width(model, slot):
        return True
    view = slot.models.get(model)
    return view is not None and _shared_device(view, slot) is not None


def _shared_device(view: ModelView, slot: SlotView) -> int | None:
    """The first device a width-1 model fits on beside what is there (by reported memory)."""
    if view.width != 1 or view.memory_bytes is None:
        return None
    for i, room in enumerate(slot.room):
        if room is not None and room >= view.memory_bytes:
            return i
    return None


def _evictable(view: ModelView) -> bool:
    return view.state == "ready" and not view.pinned


def _idle_key(view: ModelView) -> tuple[int, float]:
    """Sorts idle-longest first: known idle models by last use, then unknown, then busy."""
    if view.inflight > 0:
        return (2, 0.0)
    if view.last_used is None:
        return (1, 0.0)
    return (0, view.last_used)


def _slot_idle_key(slot: SlotView) -> tuple[int, float] | None:
    keys = [_idle_key(v) for v in slot.models.values() if _evictable(v)]
    return min(keys) if keys else None
