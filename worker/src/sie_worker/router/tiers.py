"""The tier scorer of the router's slot choice: how far a slot is from serving a model now,
as the ladder of :func:`sie_worker.router.policy.choose_slot` reads it, best first. Pure.

``ready`` (the model is ready there), ``loading``, ``free_device`` (a contiguous run of
free devices as wide as the model, or, for a width-1 model whose memory the worker
reports, a device with that much memory left: the worker's sharing rule), ``evict_lru``
(an idle unpinned model can make room). Each tier is a test of one slot, asked in order,
so a request for a model ready somewhere reads nothing else of the slots.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from sie_worker.router.policy import ModelView, SlotView

__all__ = [
    "TIERS",
    "Tier",
    "can_evict",
    "evictable",
    "fits_now",
    "free_run",
    "holds_loading",
    "holds_ready",
    "idle_key",
    "shared_device",
    "slot_idle_key",
]

Tier = Literal["ready", "loading", "free_device", "evict_lru"]


def free_run(devices: Iterable[tuple[str, str | None]]) -> int:
    """Length of the longest contiguous run of free devices."""
    longest = current = 0
    for _, held in devices:
        current = current + 1 if held is None else 0
        longest = max(longest, current)
    return longest


def shared_device(view: ModelView, slot: SlotView) -> int | None:
    """The first device a width-1 model fits on beside what is there (by reported memory)."""
    if view.width != 1 or view.memory_bytes is None:
        return None
    for i, room in enumerate(slot.room):
        if room is not None and room >= view.memory_bytes:
            return i
    return None


def fits_now(model: str, slot: SlotView) -> bool:
    """A run of free devices as wide as the model, or a device it may share."""
    view = slot.models.get(model)
    if free_run(slot.devices) >= (view.width if view is not None else 1):
        return True
    return view is not None and shared_device(view, slot) is not None


def evictable(view: ModelView) -> bool:
    return view.state == "ready" and not view.pinned


def idle_key(view: ModelView) -> tuple[int, float]:
    """Sorts idle-longest first: known idle models by last use, then unknown, then busy."""
    if view.inflight > 0:
        return (2, 0.0)
    if view.last_used is None:
        return (1, 0.0)
    return (0, view.last_used)


def slot_idle_key(slot: SlotView) -> tuple[int, float] | None:
    """The idle key of the slot's best eviction victim; None: nothing to evict."""
    keys = [idle_key(v) for v in slot.models.values() if evictable(v)]
    return min(keys) if keys else None


def holds_ready(model: str, slot: SlotView) -> bool:
    return slot.state_of(model) == "ready"


def holds_loading(model: str, slot: SlotView) -> bool:
    return slot.state_of(model) == "loading"


def can_evict(model: str, slot: SlotView) -> bool:
    return slot_idle_key(slot) is not None


TIERS: tuple[tuple[Tier, Callable[[str, SlotView], bool]], ...] = (
    ("ready", holds_ready),
    ("loading", holds_loading),
    ("free_device", fits_now),
    ("evict_lru", can_evict),
)
