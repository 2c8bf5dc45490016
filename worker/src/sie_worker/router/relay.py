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
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sie_worker.backends.hop import BackendDispatch
from sie_worker.http import relay as _relay
from sie_worker.http.relay import RelayLimits, Upstream
from sie_worker.http.upstream import open_stream
from sie_worker.http.upstream_answer import UpstreamAnswer
from sie_worker.router.choice import ChooseSlot
from sie_worker.router.policy import Decision
from sie_worker.router.state import SlotTable

__all__ = ["SlotChoice", "SlotRelayResponse"]

logger = logging.getLogger("sie_worker.router")

# Unsent bytes held per relayed answer: past this, reading from the slot pauses until the
# client has taken them, so a slow client slows its slot's stream instead of growing memory.
_HIGH_WATER = 1024 * 1024


@dataclass
class _SlotDispatch(BackendDispatch):
    """One try on one slot, accounted in the slot table (see :class:`_relay.Dispatch`)."""

    table: SlotTable
    decision: Decision
    model: str | None
    queued: bool  # counted in sie_router_queued_requests until connected
    response_headers: Sequence[tuple[bytes, bytes]] = field(default_factory=list)

    @property
    def error_headers(self) -> Sequence[tuple[str, str]]:
        return [("x-sie-slot", str(self.decision.slot))]

    def connected(self) -> None:
        if self.queued:
            self.queued = False
            self.table.metrics.queued.dec()

    def refused(self, reason: str) -> None:
        self.table.mark_down(self.decision.slot, reason)

    def answered(self, status: int) -> None:
        self.table.metrics.requests_of(self.decision.slot, status).inc()

    def finished(self, *, status: int | None) -> None:
        self.table.finished(
            self.decision.slot,
            self.model,
            changed=self.decision.reason != "ready",
            served=status is not None and status < 400,
        )


@dataclass(frozen=True)
class SlotChoice:
    """A try's slot, as :mod:`sie_worker.http.relay` asks for it: ``pick`` chooses it (by
    policy, by name, or any), then it is counted as dispatched and accounted as one try."""

    table: SlotTable
    model: str | None
    pick: ChooseSlot

    async def __call__(self, exclude: frozenset[Hashable], hold: bool) -> _relay.Dispatch:
        table = self.table
        decision = await self.pick(frozenset(k for k in exclude if isinstance(k, int)), hold)
        table.metrics.decisions_of(decision.reason).inc()
        table.dispatched(decision.slot, self.model, decision.reason)
        # A request for a model that is not ready waits for it: counted as queued.
        queued = self.model is not None and decision.reason != "ready"
        if queued:
            table.metrics.queued.inc()
        headers = [
            (b"x-sie-slot", str(decision.slot).encode()),
            (b"x-sie-route-reason", decision.reason.encode()),
        ]
        slot = decision.slot
        state = table.slots[slot]
        return _SlotDispatch(
            state, slot, f"slot {slot}", table, decision, self.model, queued, headers
        )


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
            opener=_open,
            arrived=time.monotonic() if arrived is None else arrived,
        )


async def _open(url: str, *args: Any, **kwargs: Any) -> UpstreamAnswer:
    # Looked up at call time, so tests can replace this module's open_stream.
    return await open_stream(url, *args, **kwargs)
