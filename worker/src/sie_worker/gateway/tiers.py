"""The tier scorer of the gateway's pod choice: how far a pod is from serving a model now.
Pure.

0 ``ready`` (a slot has it ready), 1 ``loading``, 2 ``free_slot`` (a slot has a contiguous
run of free GPUs as wide as the model), 3 ``least_outstanding`` (its router evicts or
queues): lower is better."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, Protocol

__all__ = ["TIERS", "Tiered", "tier_of"]

TIERS: tuple[Literal["ready", "loading", "free_slot", "least_outstanding"], ...] = (
    "ready",
    "loading",
    "free_slot",
    "least_outstanding",
)


class Tiered(Protocol):
    """What the tier reads of a pod."""

    @property
    def models(self) -> Mapping[str, str]: ...
    @property
    def free_run(self) -> int: ...


def tier_of(pod: Tiered, model: str, width: int) -> int:
    """The pod's tier for ``model`` of ``width`` GPUs per slot (an index of :data:`TIERS`)."""
    state = pod.models.get(model)
    if state == "ready":
        return 0
    if state == "loading":
        return 1
    if pod.free_run >= width:
        return 2
    return 3
