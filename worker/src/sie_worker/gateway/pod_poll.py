"""What the gateway keeps of one poll of a pod's router (:class:`PodPoll`), read from the
shared poll reader's answer (:mod:`sie_worker.backends.answers`); the background loop that
polls is the shared one, run by the fleet (:mod:`sie_worker.gateway.state`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from sie_worker.backends.answers import BackendPoll, DeviceEntry

__all__ = ["PodPoll", "free_run_per_slot", "pod_poll", "slot_width_of"]


@dataclass(frozen=True)
class PodPoll:
    models: dict[str, str]  # model -> state (the best over the pod's slots)
    widths: dict[str, int]
    free_run: int  # widest run of free devices within one slot
    slots: int
    ready_slots: int
    ready: bool
    slot_width: int = 0  # devices of the widest slot (0: not known)
    # model -> its LoRA adapters the pod serves now (only models with some)
    adapters: dict[str, frozenset[str]] = field(default_factory=dict)


def pod_poll(answer: BackendPoll) -> PodPoll:
    """The gateway's reading of one poll of a pod router."""
    return PodPoll(
        {name: e.state for name, e in answer.models.items()},
        {name: e.width for name, e in answer.models.items() if e.width is not None},
        free_run_per_slot(answer.devices),
        answer.slots,
        answer.ready_slots,
        answer.ready,
        slot_width_of(answer.devices),
        {name: e.adapters for name, e in answer.models.items() if e.adapters},
    )


def free_run_per_slot(devices: Sequence[DeviceEntry]) -> int:
    """The widest run of free devices within one slot (devices without a ``slot``, as a
    worker lists them, are one slot)."""
    runs: dict[object, int] = {}
    best: dict[object, int] = {}
    for entry in devices:
        run = runs.get(entry.slot, 0) + 1 if entry.model is None else 0
        runs[entry.slot] = run
        best[entry.slot] = max(best.get(entry.slot, 0), run)
    return max(best.values(), default=0)


def slot_width_of(devices: Sequence[DeviceEntry]) -> int:
    """The devices of the pod's widest slot; 0 when it lists none."""
    return max(Counter(entry.slot for entry in devices).values(), default=0)
