"""The choose step of the router's request path: which slot a try goes to.

Each is called with the slots already tried and whether the request may wait (not for a
resumption), and returns the :class:`~sie_worker.router.policy.Decision`:

- :class:`ByPolicy`: the slot table's policy for a model (waiting, bounded by
  ``SIE_ROUTER_QUEUE_TIMEOUT_S``, while it says ``wait``); the chosen slot is sent the
  request's prefix blocks;
- :class:`NamedSlot`: the slot ``?slot=N`` / ``X-SIE-Slot`` names, unless out of rotation;
- :class:`AnySlot`: the answering slot with the fewest requests in flight.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio

from sie_worker.errors import EngineUnavailable
from sie_worker.router.policy import Decision
from sie_worker.router.state import SlotTable

__all__ = ["AnySlot", "ByPolicy", "ChooseSlot", "NamedSlot", "no_slot"]

# Picks the slot of a try, given the slots already tried; the flag: whether it may wait for
# a slot (not for a resumption).
ChooseSlot = Callable[[frozenset[int], bool], Awaitable[Decision]]


@dataclass(frozen=True)
class ByPolicy:
    table: SlotTable
    model: str
    prefix: tuple[int, ...] = ()
    adapter: str | None = None  # the LoRA adapter it names (its slots first)

    async def __call__(self, exclude: frozenset[int], hold: bool) -> Decision:
        table = self.table
        deadline = time.monotonic() + table.settings.queue_timeout_s
        queued = False
        try:
            while True:
                decision = table.decide(
                    self.model, exclude=exclude, prefix=self.prefix, adapter=self.adapter
                )
                if decision is None:
                    raise no_slot(table)
                if decision.reason != "wait":
                    table.sent(decision.slot, self.prefix)
                    return decision
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not hold:
                    table.sent(decision.slot, self.prefix)
                    return Decision(decision.slot, "least_outstanding")
                if not queued:
                    table.metrics.queued.inc()
                    queued = True
                with anyio.move_on_after(remaining):
                    await table.changed()
        finally:
            if queued:
                table.metrics.queued.dec()


@dataclass(frozen=True)
class NamedSlot:
    table: SlotTable
    slot: int

    async def __call__(self, exclude: frozenset[int], hold: bool) -> Decision:
        state = self.table.slots[self.slot]
        # A named slot is tried unless it is out of rotation: one slow first poll does not
        # make a slot "not answering" (three in a row, or a refusal, do).
        if self.slot in exclude or state.down:
            raise EngineUnavailable(
                f"slot {self.slot} ({state.url}) is not answering: {state.last_error}"
            )
        return Decision(self.slot, "named_slot")


@dataclass(frozen=True)
class AnySlot:
    table: SlotTable

    async def __call__(self, exclude: frozenset[int], hold: bool) -> Decision:
        candidates = [s for s in self.table.slots if s.up and s.index not in exclude]
        if not candidates:
            raise no_slot(self.table)
        best = min(candidates, key=lambda s: (s.outstanding, s.index))
        return Decision(best.index, "least_outstanding")


def no_slot(table: SlotTable) -> EngineUnavailable:
    """The refusal when no slot of the pod answers, with each slot's last error."""
    detail = "; ".join(
        f"slot {s.index} ({s.url}): {s.last_error or 'not polled yet'}" for s in table.slots
    )
    return EngineUnavailable(f"no slot of this pod is answering ({detail})")
