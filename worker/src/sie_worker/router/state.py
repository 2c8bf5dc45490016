"""What the router knows about each slot: polled from the workers, plus what it just sent.

Each slot's worker is polled in the background (``/v1/models``, ``/v1/devices``,
``/readyz``) every ``poll_interval_s`` and at once after the router changed it, so routing
never waits on a round trip. Between polls, requests the router dispatched are applied to
the last poll optimistically (:func:`record_dispatch`); a poll that started after a
dispatch supersedes it, unless the dispatched request is still in flight and the worker
does not show its model loading yet (the request has not reached it). A slot that fails
``down_after_failures`` polls in a row (or refuses a connection) leaves rotation, its
in-flight requests are aborted, and polling goes on so it comes back when it answers again.
These rules, the poll reader and the poll loop are the gateway's too
(:mod:`sie_worker.backends`); the table also keeps the slots' prompt-prefix index.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import httpx

from sie_worker.backends.answers import BackendPoll, poll_backend
from sie_worker.backends.prefix import PrefixIndex
from sie_worker.backends.table import Attempt, Backend, poll_loop
from sie_worker.http.connections import Connections
from sie_worker.http.poll import PollError
from sie_worker.model_states import MODEL_STATES
from sie_worker.router.metrics import RouterMetrics
from sie_worker.router.policy import (
    Decision,
    ModelView,
    SlotView,
    choose_by_prefix,
    choose_slot,
    record_dispatch,
    record_served,
)
from sie_worker.router.settings import RouterSettings

__all__ = ["RoutingPolicy", "SlotAttempt", "SlotState", "SlotTable", "slot_view_parts"]

logger = logging.getLogger("sie_worker.router")

# The decision for a model (and the LoRA adapter it names) over the slots' views.
RoutingPolicy = Callable[[str, Sequence[SlotView], str | None], Decision | None]


@dataclass(eq=False)
class SlotState(Backend):
    """One slot's worker: the shared backend record, plus the last poll as routing sees it."""

    index: int = 0
    polled: SlotView | None = None

    @property
    def up(self) -> bool:
        return self.answering

    def view(self) -> SlotView:
        """The slot as routing sees it: last poll, then newer dispatches, then live counts."""
        base = self.polled or SlotView(index=self.index)
        for _, model, served in self.pending:
            base = record_served(base, model) if served else record_dispatch(base, model)
        # Each model's in-flight count is the larger of the worker's and the router's. Only
        # the models the router counts more requests on are rebuilt: a worker lists every
        # configured model (hundreds, with a catalogue), and this runs per slot per request.
        polled = base.models
        counts = self.inflight_by_model
        raised = {
            name: replace(v, inflight=n)
            for name, n in counts.items()
            if (v := polled.get(name)) is not None and n > v.inflight
        }
        models = {**polled, **raised} if raised else polled
        return replace(base, up=self.up, outstanding=self.outstanding, models=models)


@dataclass(eq=False)
class SlotAttempt(Attempt):
    """One try on one slot (:meth:`SlotTable.attempt`): counted by decision reason and in
    the slot's in-flight gauge; a request for a model that is not ready yet waits for it,
    counted in ``sie_router_queued_requests`` until its answer's head (or its end)."""

    table: SlotTable = field(kw_only=True)
    decision: Decision = field(kw_only=True)
    model: str | None = field(kw_only=True)
    queued: bool = False
    loads: bool = False  # the slot's worker loads the model for it (or may: not ready)

    def started(self) -> None:
        table, decision = self.table, self.decision
        table.metrics.decisions_of(decision.reason).inc()
        self.loads = table.loads(decision.slot, self.model, decision.reason)
        table.dispatched(decision.slot, self.model, decision.reason)
        if self.model is not None and self.loads:
            self.queued = True
            table.metrics.queued.inc()

    def answered(self, status: int) -> None:
        self.status = status
        self._dequeue()
        self.table.metrics.requests_of(self.decision.slot, status).inc()

    def ended(self) -> None:
        table, slot = self.table, self.decision.slot
        self._dequeue()
        if self.refused is not None:
            table.mark_down(slot, self.refused)
        table.finished(slot, self.model, changed=self.loads, served=self.served)

    def _dequeue(self) -> None:
        if self.queued:
            self.queued = False
            self.table.metrics.queued.dec()


class SlotTable:
    """Every slot's state, the routing decision over it, and the metrics that mirror it."""

    def __init__(
        self,
        settings: RouterSettings,
        metrics: RouterMetrics,
        *,
        policy: RoutingPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.policy: RoutingPolicy = policy or choose_slot
        self.clock = clock
        self.slots = [
            SlotState(settings.worker_url(i), index=i) for i in range(settings.slot_count)
        ]
        self.polled_once = asyncio.Event()  # set once every slot was polled (or failed)
        # Idle connections to the slots' workers, while the app runs (its lifespan's).
        self.connections: Connections | None = None
        # Which slot was sent which prompt prefixes (SIE_ROUTER_PREFIX_*).
        self.prefixes = PrefixIndex(settings.prefix.index_blocks)
        self._first_round: set[int] = set()
        self._changed = asyncio.Event()

    async def changed(self) -> None:
        """Return at the next change of any slot's state (a poll, a request ending)."""
        await self._changed.wait()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # -- routing -------------------------------------------------------------------------

    def views(self) -> list[SlotView]:
        return [s.view() for s in self.slots]

    def known_models(self) -> set[str]:
        """Every model some slot lists or was sent (without building the views)."""
        known = {m for s in self.slots if s.polled is not None for m in s.polled.models}
        known.update(m for s in self.slots for _, m, _ in s.pending)
        return known

    def decide(
        self,
        model: str,
        *,
        exclude: frozenset[int] = frozenset(),
        prefix: tuple[int, ...] = (),
        adapter: str | None = None,
    ) -> Decision | None:
        """Where a request for ``model`` (and LoRA ``adapter``) goes; ``prefix``: its
        prompt's block hashes."""
        views = [v for v in self.views() if v.index not in exclude]
        if prefix:
            hits = self.prefixes.hits(prefix)
            decision = choose_by_prefix(model, views, hits.best) if hits else None
            if decision is not None:
                return decision
        return self.policy(model, views, adapter)

    def sent(self, slot: int, prefix: tuple[int, ...]) -> None:
        """The request of ``prefix`` went to ``slot``: its worker holds those blocks now."""
        self.prefixes.record(prefix, slot)

    def any_ready(self) -> bool:
        return any(s.up and s.ready for s in self.slots)

    def attempt(self, decision: Decision, model: str | None) -> SlotAttempt:
        """One try of a request for ``model`` on the slot ``decision`` chose: ``async with``
        it around the try."""
        slot = decision.slot
        headers = (
            (b"x-sie-slot", str(slot).encode()),
            (b"x-sie-route-reason", decision.reason.encode()),
        )
        return SlotAttempt(
            self.slots[slot],
            slot,
            f"slot {slot}",
            response_headers=headers,
            error_headers=(("x-sie-slot", str(slot)),),
            table=self,
            decision=decision,
            model=model,
        )

    def loads(self, slot: int, model: str | None, decision_reason: str) -> bool:
        """Whether a request for ``model`` sent to ``slot`` for ``decision_reason`` may make
        its worker load the model: not when it was sent there for being ready, nor for a
        cached prefix where the last poll shows it ready (such a request changes nothing a
        poll would show: it is not recorded as a load, and its end polls nothing)."""
        if model is None or decision_reason == "ready":
            return False
        if decision_reason == "prefix":
            polled = self.slots[slot].polled
            entry = polled.models.get(model) if polled is not None else None
            return entry is None or entry.state != "ready"
        return True

    def dispatched(self, slot: int, model: str | None, decision_reason: str) -> None:
        state = self.slots[slot]
        state.note_dispatch(model, self.clock(), loads=self.loads(slot, model, decision_reason))
        self.metrics.inflight_of[slot].set(state.outstanding)

    def finished(self, slot: int, model: str | None, *, changed: bool, served: bool) -> None:
        """A request ended; ``served`` when the worker answered it successfully."""
        state = self.slots[slot]
        state.note_finish(model, self.clock(), served=changed and served)
        self.metrics.inflight_of[slot].set(state.outstanding)
        if changed:
            self.poke(slot)
        self._notify()

    def poke(self, slot: int) -> None:
        """Ask the slot's poller to poll now (its state just changed)."""
        self.slots[slot].wake.set()

    # -- polling results -----------------------------------------------------------------

    def apply_poll(
        self,
        slot: int,
        started_at: float,
        models: dict[str, ModelView],
        devices: tuple[tuple[str, str | None], ...],
        ready: bool,
        room: tuple[int | None, ...] = (),
    ) -> None:
        state = self.slots[slot]
        was_answering = state.answering

        def state_of(model: str) -> str | None:
            view = models.get(model)
            return view.state if view is not None else None

        if not state.accept_poll(started_at, state_of):
            return  # an older poll finished late
        state.polled = SlotView(index=slot, devices=devices, models=models, room=room)
        state.ready = ready
        if not was_answering:
            logger.info("slot %d (%s) answers; back in rotation", slot, state.url)
        self._round_done(slot)
        self._publish()
        self._notify()

    def poll_failed(self, slot: int, error: PollError) -> None:
        state = self.slots[slot]
        if state.note_poll_failure(error, self.settings.down_after_failures):
            self.mark_down(slot, str(error))
        self._round_done(slot)

    def mark_down(self, slot: int, reason: str) -> None:
        """Take the slot out of rotation and abort its in-flight requests."""
        state = self.slots[slot]
        if state.take_down(reason):
            self.prefixes.forget(slot)  # its worker may come back with an empty cache
            logger.warning("slot %d (%s) out of rotation: %s", slot, state.url, reason)
        self._publish()
        self._notify()

    def _round_done(self, slot: int) -> None:
        self._first_round.add(slot)
        if len(self._first_round) == len(self.slots):
            self.polled_once.set()

    def _publish(self) -> None:
        by_state: Counter[str] = Counter()
        for s in self.slots:
            label = str(s.index)
            self.metrics.slot_up.labels(slot=label).set(1 if s.up else 0)
            self.metrics.slot_ready.labels(slot=label).set(1 if s.up and s.ready else 0)
            if s.up and s.polled is not None:
                by_state.update(v.state for v in s.polled.models.values())
        for state_name in MODEL_STATES:
            self.metrics.models.labels(state=state_name).set(by_state.get(state_name, 0))

    # -- the poll loop -------------------------------------------------------------------

    async def run_poller(self, slot: int, client: httpx.AsyncClient) -> None:
        state = self.slots[slot]
        headers = _auth_headers(self.settings)

        async def poll() -> BackendPoll:
            return await poll_backend(client, state.url, headers, self.settings.poll_timeout_s)

        def applied(started: float, answer: BackendPoll) -> None:
            models, devices, room = slot_view_parts(answer)
            self.apply_poll(slot, started, models, devices, answer.ready, room)

        await poll_loop(
            state,
            poll,
            applied,
            lambda error: self.poll_failed(slot, error),
            interval_s=self.settings.poll_interval_s,
            clock=self.clock,
        )


def slot_view_parts(
    answer: BackendPoll,
) -> tuple[dict[str, ModelView], tuple[tuple[str, str | None], ...], tuple[int | None, ...]]:
    """What the router's policy reads of one poll: its models, its devices (each with the
    first model on it) and the memory each device has left (None: not known)."""
    models = {
        name: ModelView(
            state=e.state,
            width=e.width or 1,
            pinned=e.pinned,
            last_used=e.last_used,
            inflight=e.inflight,
            memory_bytes=e.memory_bytes,
            adapters=e.adapters,
        )
        for name, e in answer.models.items()
    }
    devices = tuple((d.device, d.model) for d in answer.devices)
    return models, devices, tuple(d.room_bytes for d in answer.devices)


def _auth_headers(settings: RouterSettings) -> dict[str, str]:
    return {"authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
