"""Relay one request to the slot the policy picks: the router's side of
:mod:`sie_worker.http.relay` (which streams the answer without buffering).

Each relayed request goes to the slot on an idle connection of the router's
(:attr:`SlotTable.connections`), else a new one (``sie_worker.http.upstream``, parsed by
httptools): httpx's pool bookkeeping and per-chunk parsing were most of the router's CPU
with many streams (``docs/benchmarks.md``).
A slot that refuses a connection leaves rotation; a request that never reached its worker
is routed again without that slot.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable
from dataclasses import dataclass

from sie_worker.http import relay as _relay
from sie_worker.http.relay import RelayLimits, Upstream
from sie_worker.router.choice import ChooseSlot
from sie_worker.router.state import SlotAttempt, SlotTable

__all__ = ["SlotChoice", "SlotRelayResponse"]

logger = logging.getLogger("sie_worker.router")

# Unsent bytes held per relayed answer: past this, reading from the slot pauses until the
# client has taken them, so a slow client slows its slot's stream instead of growing memory.
_HIGH_WATER = 1024 * 1024


@dataclass(frozen=True)
class SlotChoice:
    """A try's slot, as :mod:`sie_worker.http.relay` asks for it: ``pick`` chooses it (by
    policy, by name, or any); the try is the slot table's attempt on it."""

    table: SlotTable
    model: str | None
    pick: ChooseSlot

    async def __call__(self, exclude: frozenset[Hashable], hold: bool) -> SlotAttempt:
        decision = await self.pick(frozenset(k for k in exclude if isinstance(k, int)), hold)
        return self.table.attempt(decision, self.model)


class SlotRelayResponse(_relay.RelayResponse):
    """Route (by slot), relay and account for one request."""

    def __init__(
        self,
        table: SlotTable,
        upstream: Upstream,
        pick: ChooseSlot,
        *,
        arrived: float | None = None,
    ) -> None:
        settings = table.settings
        super().__init__(
            upstream,
            SlotChoice(table, upstream.model, pick),
            RelayLimits(
                settings.connect_timeout_s,
                settings.read_timeout_s,
                _HIGH_WATER,
                connections=table.connections,
                resume_max=settings.resume_max,
                on_resume=table.metrics.resumed,
            ),
            on_done=table.metrics.duration.observe,
            arrived=time.monotonic() if arrived is None else arrived,
        )
