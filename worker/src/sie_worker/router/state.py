"""What the router knows about each slot: polled from the workers, plus what it just sent.

Each slot's worker is polled in the background (``/v1/models``, ``/v1/devices``,
``/readyz``) every ``poll_interval_s`` and at once after the router changed it, so routing
never waits on a round trip. Between polls, requests the router dispatched are applied to
the last poll optimistically (:func:`record_dispatch`); a poll that started after a
dispatch supersedes it, unless the dispatched request is still in flight and the worker
does not show its model loading yet (the request has not reached it). A slot that fails
``down_after_failures`` polls in a row (or refuses a connection) leaves rotation, its
in-flight requests are aborted, and polling goes on so it comes back when it answers again.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import anyio
import httpx

from sie_worker.http.connections import Connections
from sie_worker.http.poll import PollError, poll_answers
from sie_worker.model_states import MODEL_STATES, parse_state
from sie_worker.router.metrics import RouterMetrics
from sie_worker.router.policy import (
    Decision,
    ModelView,
    SlotView,
    choose_slot,
    record_dispatch,
    record_served,
)
from sie_worker.router.settings import RouterSettings

__all__ = [
    "RoutingPolicy",
    "SlotState",
    "SlotTable",
    "parse_devices",
    "parse_models",
    "poll_slot",
]

logger = logging.getLogger("sie_worker.router")

RoutingPolicy = Callable[[str, Sequence[SlotView]], Decision | None]
Abort = Callable[[], None]


@dataclass
class SlotState:
    index: int
    url: str
    up: bool = False
    # Taken out of rotation (refused, or missed ``down_after_failures`` polls in a row) and
    # not back yet; a slot that has not answered its first poll is not up, but not down.
    down: bool = False
    ready: bool = False
    failures: int = 0
    last_error: str | None = None
    polled: SlotView | None = None
    polled_at: float = -math.inf  # monotonic start time of the poll behind ``polled``
    # What the router did since: (monotonic time, model, True once a worker served it).
    pending: list[tuple[float, str, bool]] = field(default_factory=list)
    outstanding: int = 0
    inflight_by_model: Counter[str] = field(default_factory=Counter)
    aborts: set[Abort] = field(default_factory=set)
    wake: asyncio.Event = field(default_factory=asyncio.Event)

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
        self.slots = [SlotState(i, settings.worker_url(i)) for i in range(settings.slot_count)]
        self.polled_once = asyncio.Event()  # set once every slot was polled (or failed)
        # Idle connections to the slots' workers, while the app runs (its lifespan's).
        self.connections: Connections | None = None
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

    def decide(self, model: str, *, exclude: frozenset[int] = frozenset()) -> Decision | None:
        views = [v for v in self.views() if v.index not in exclude]
        return self.policy(model, views)

    def any_ready(self) -> bool:
        return any(s.up and s.ready for s in self.slots)

    def dispatched(self, slot: int, model: str | None, decision_reason: str) -> None:
        state = self.slots[slot]
        state.outstanding += 1
        self.metrics.inflight_of[slot].set(state.outstanding)
        if model is None:
            return
        state.inflight_by_model[model] += 1
        if decision_reason != "ready":
            state.pending.append((self.clock(), model, False))

    def finished(self, slot: int, model: str | None, *, changed: bool, served: bool) -> None:
        """A request ended; ``served`` when the worker answered it successfully."""
        state = self.slots[slot]
        if changed and served and model is not None:
            state.pending.append((self.clock(), model, True))
        state.outstanding -= 1
        self.metrics.inflight_of[slot].set(state.outstanding)
        if model is not None:
            state.inflight_by_model[model] -= 1
            if state.inflight_by_model[model] <= 0:
                del state.inflight_by_model[model]
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
    ) -> None:
        state = self.slots[slot]
        if started_at < state.polled_at:
            return  # an older poll finished late
        state.polled = SlotView(index=slot, devices=devices, models=models)
        state.polled_at = started_at
        # A dispatch stays while its request is in flight and the poll does not show the
        # model yet: the request may not have reached the worker when the poll was answered
        # (a loaded machine), and a burst must keep following it to the same slot.
        state.pending = [
            p
            for p in state.pending
            if p[0] > started_at
            or (
                not p[2]
                and state.inflight_by_model.get(p[1], 0) > 0
                and _not_begun(models.get(p[1]))
            )
        ]
        state.failures = 0
        state.last_error = None
        state.ready = ready
        if not state.up:
            logger.info("slot %d (%s) answers; back in rotation", slot, state.url)
        state.up = True
        state.down = False
        self._round_done(slot)
        self._publish()
        self._notify()

    def poll_failed(self, slot: int, error: PollError) -> None:
        state = self.slots[slot]
        state.failures += 1
        state.last_error = str(error)
        if error.refused or state.failures >= self.settings.down_after_failures:
            self.mark_down(slot, str(error))
        self._round_done(slot)

    def mark_down(self, slot: int, reason: str) -> None:
        """Take the slot out of rotation and abort its in-flight requests."""
        state = self.slots[slot]
        was_up = state.up
        state.up = False
        state.down = True
        state.ready = False
        state.last_error = reason
        state.pending.clear()
        if was_up:
            logger.warning("slot %d (%s) out of rotation: %s", slot, state.url, reason)
        for abort in list(state.aborts):
            abort()
        state.wake.set()
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
        while True:
            state.wake.clear()
            started = self.clock()
            try:
                models, devices, ready = await poll_slot(
                    client, state.url, headers, self.settings.poll_timeout_s
                )
            except PollError as exc:
                self.poll_failed(slot, exc)
            else:
                self.apply_poll(slot, started, models, devices, ready)
            with anyio.move_on_after(self.settings.poll_interval_s):
                await state.wake.wait()


async def poll_slot(
    client: httpx.AsyncClient, url: str, headers: dict[str, str], timeout_s: float
) -> tuple[dict[str, ModelView], tuple[tuple[str, str | None], ...], bool]:
    """One poll of one worker: its models, its devices and whether it is ready."""
    models_r, devices_r, ready_r = await poll_answers(client, url, headers, timeout_s)
    try:
        models = parse_models(models_r.json())
        devices = parse_devices(devices_r.json())
    except ValueError as exc:
        raise PollError(f"{url}: unusable answer: {exc}") from exc
    return models, devices, ready_r.status_code == 200


def parse_models(body: Any) -> dict[str, ModelView]:
    """``/v1/models`` → views by id; raises ValueError when the shape is not the worker's."""
    if not isinstance(body, dict) or not isinstance(body.get("data"), list):
        raise ValueError('/v1/models: expected {"data": [...]}')
    models: dict[str, ModelView] = {}
    for entry in body["data"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
            raise ValueError("/v1/models: every entry needs a string id")
        if isinstance(entry.get("parent"), str):
            continue  # a LoRA adapter lives on its base model, which is listed itself
        devices = entry.get("devices")
        width = entry.get("width")
        if not isinstance(width, int) or isinstance(width, bool) or width < 1:
            width = len(devices) if isinstance(devices, list) and devices else 1
        last_used = entry.get("last_used")
        inflight = entry.get("inflight")
        models[entry["id"]] = ModelView(
            state=parse_state(entry.get("state")),
            width=width,
            pinned=entry.get("pinned") is True,
            last_used=_finite(last_used),
            inflight=max(inflight, 0)
            if isinstance(inflight, int) and not isinstance(inflight, bool)
            else 0,
        )
    return models


def parse_devices(body: Any) -> tuple[tuple[str, str | None], ...]:
    """``/v1/devices`` → ((device, model or None), ...) in the worker's order."""
    if not isinstance(body, dict) or not isinstance(body.get("devices"), list):
        raise ValueError('/v1/devices: expected {"devices": [...]}')
    devices: list[tuple[str, str | None]] = []
    for entry in body["devices"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("device"), str):
            raise ValueError("/v1/devices: every entry needs a string device")
        model = entry.get("model")
        devices.append((entry["device"], model if isinstance(model, str) else None))
    return tuple(devices)


def _not_begun(view: ModelView | None) -> bool:
    """True when a poll shows a dispatched model neither loading nor ready (not reached)."""
    return view is not None and view.state not in ("loading", "ready")


def _finite(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _auth_headers(settings: RouterSettings) -> dict[str, str]:
    return {"authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
