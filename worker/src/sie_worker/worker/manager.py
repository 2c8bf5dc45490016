"""Model lifecycle: unloaded -> loading -> ready | failed, on blocks the allocator picks.

Invariants kept here (and checked by the API tests):

- A device is claimed by at most one model; ``/v1/devices`` and ``/v1/models`` are two
  views of the same claims.
- Concurrent requests for one model share a single load; loads on disjoint blocks run in
  parallel (only the placement decision is serialised).
- An engine that a new load displaces (eviction, unload) drains its in-flight requests
  (bounded by ``drain_timeout_s``) and exits before the next engine starts on its devices.
- A failed load, a crash or an unload releases the model's devices at once.
- Pinned models are never evicted; the keeper reloads them (with backoff) when they fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine, Iterable, Mapping
from typing import Any

import anyio
import httpx

from sie_worker.config.loadtime import LoadOptions, resolve_load_options
from sie_worker.config.model import ModelConfig, served_models
from sie_worker.errors import (
    InvalidConfig,
    LoadFailed,
    ModelLoading,
    PlacementFailed,
    SieError,
    UnknownModel,
)
from sie_worker.settings import Settings
from sie_worker.worker import ports
from sie_worker.worker.allocator import Claim, NoPlacement, place
from sie_worker.worker.engine_process import EngineProcess, PortInUse, start_group_guard
from sie_worker.worker.launch import engine_env, plan_launch
from sie_worker.worker.metrics import STATES, WorkerMetrics
from sie_worker.worker.proxy import Lease
from sie_worker.worker.records import ModelRecord, RunningEngine, device_entries, model_entry

__all__ = ["ModelManager"]

_log = logging.getLogger("sie_worker.manager")
_PORT_ATTEMPTS = 3
_PLACEMENT_BACKOFF_S = 0.5
_PINNED_BACKOFF_MAX_S = 60.0
_ENGINE_WITHHELD_ENV = frozenset({"SIE_API_KEY"})


class ModelManager:
    """Owns every model record, every claim and every engine of one worker."""

    def __init__(
        self,
        settings: Settings,
        client: httpx.AsyncClient,
        metrics: WorkerMetrics,
        configs: Mapping[str, ModelConfig],
        *,
        base_env: Mapping[str, str],
    ) -> None:
        self.settings = settings
        self.devices = settings.devices
        self.client = client
        self.metrics = metrics
        # Engines need no API key; one that prints its environment (or a crash dump that
        # does) would otherwise put the key in the worker's log.
        self.base_env = {k: v for k, v in base_env.items() if k not in _ENGINE_WITHHELD_ENV}
        self.records: dict[str, ModelRecord] = {}
        self._lock = asyncio.Lock()
        self._device_stops: dict[int, asyncio.Task[None]] = {}
        # Ports picked for engines still starting: a port passes the bind test until its
        # engine binds it, so two loads starting at once could otherwise both pick it.
        self._reserved_ports: set[int] = set()
        self._placement_backoff: dict[int, float] = {}
        self._keeper_wake = asyncio.Event()
        self._keeper: asyncio.Task[None] | None = None
        self._closing = False
        self._tasks: set[asyncio.Task[Any]] = set()  # keep background tasks referenced
        for config in configs.values():
            self._add_config(config)
        for model_id in settings.pinned_models:
            self.record(model_id).pinned = True
        self._refresh_gauges()

    # --- lifecycle of the manager -----------------------------------------------------

    def start(self) -> None:
        """Start loading pinned models in the background (``/readyz`` waits for them)."""
        start_group_guard()
        self._keeper = asyncio.create_task(self._keep_pinned(), name="pinned-keeper")

    async def shutdown(self) -> None:
        self._closing = True
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeper
        loads = [r.load_task for r in self.records.values() if r.load_task is not None]
        for task in loads:
            task.cancel()
        await asyncio.gather(*loads, return_exceptions=True)
        async with self._lock:
            stops = [
                self._begin_stop(r, "shutdown")
                for r in self.records.values()
                if r.running is not None
            ]
        await asyncio.gather(*stops, *self._device_stops.values(), return_exceptions=True)

    @property
    def ready(self) -> bool:
        return all(r.state == "ready" for r in self.records.values() if r.pinned)

    # --- queries ------------------------------------------------------------------------

    def record(self, model_id: str) -> ModelRecord:
        record = self.records.get(model_id)
        if record is None:
            raise UnknownModel(
                f"model {model_id!r} is not configured here; GET /v1/models lists the models"
            )
        return record

    def model_entry(self, record: ModelRecord) -> dict[str, Any]:
        return model_entry(record, self.devices)

    def model_entries(self) -> list[dict[str, Any]]:
        return [model_entry(r, self.devices) for r in self.records.values()]

    def device_entries(self) -> list[dict[str, Any]]:
        return device_entries(self.records.values(), self.devices)

    # --- requests -----------------------------------------------------------------------

    async def acquire(self, model_id: str, *, wait_s: float | None = None) -> Lease:
        """A lease on the model's ready engine, loading it first when needed."""
        record = self.record(model_id)
        for _ in range(3):
            running = record.running
            if record.state == "ready" and running is not None:
                return self._lease(record, running)
            task = self._ensure_loading(record)
            if wait_s is None:
                await asyncio.shield(task)
                continue
            try:
                await asyncio.wait_for(asyncio.shield(task), timeout=wait_s)
            except TimeoutError:
                raise ModelLoading(
                    f"{model_id} is loading; retry later or send no 'Prefer: wait' header",
                    retry_after_s=5,
                ) from None
        raise PlacementFailed(
            f"{model_id} was evicted again before it could serve; retry", retry_after_s=1
        )

    async def load(self, model_id: str) -> dict[str, Any]:
        record = self.record(model_id)
        while record.state != "ready" or record.running is None:
            await asyncio.shield(self._ensure_loading(record))
        return self.model_entry(record)

    async def unload(self, model_id: str) -> dict[str, Any]:
        """Stop the model (after its load finishes, if loading) and clear its pin."""
        record = self.record(model_id)
        record.pinned = False
        if record.load_task is not None:
            with contextlib.suppress(SieError):
                await asyncio.shield(record.load_task)
        async with self._lock:
            stop = self._begin_stop(record, "requested") if record.running else None
            record.state, record.error = "unloaded", None
            self._refresh_gauges()
        if stop is not None:
            await stop
        return self.model_entry(record)

    async def pin(self, model_id: str) -> dict[str, Any]:
        record = self.record(model_id)
        record.pinned = True
        record.pinned_backoff_s, record.pinned_retry_at = 1.0, 0.0
        return await self.load(model_id)

    async def unpin(self, model_id: str) -> dict[str, Any]:
        record = self.record(model_id)
        record.pinned = False
        self._placement_backoff.clear()
        return self.model_entry(record)

    # --- configs (Config API) ----------------------------------------------------------

    async def apply_config(self, config: ModelConfig) -> None:
        """Add or replace a model config. Loaded models keep serving; the change applies
        the next time they load (``config_pending`` shows it)."""
        new = {s.id: s for s in served_models(config)}
        gone = [r for r in self._records_of(config.sie_id) if r.id not in new]
        for served in new.values():
            record = self.records.get(served.id)
            if record is None:
                self.records[served.id] = ModelRecord(served)
            else:
                record.served = served
                record.config_pending = record.running is not None or record.load_task is not None
        await self._remove(gone)

    async def remove_config(self, sie_id: str) -> None:
        await self._remove(list(self._records_of(sie_id)))

    def _add_config(self, config: ModelConfig) -> None:
        for served in served_models(config):
            self.records[served.id] = ModelRecord(served)

    def _records_of(self, sie_id: str) -> Iterable[ModelRecord]:
        return [r for r in self.records.values() if r.served.config.sie_id == sie_id]

    async def _remove(self, records: list[ModelRecord]) -> None:
        served = {r.id: r.served for r in records}
        for record in records:
            record.pinned = False
            if record.load_task is not None:
                with contextlib.suppress(SieError):
                    await asyncio.shield(record.load_task)
        async with self._lock:
            # A PUT that wrote this config again while we waited has the last word: the
            # file is its, so keep its models (they then follow the live-change rule).
            records = [
                r for r in records if self.records.get(r.id) is r and r.served is served[r.id]
            ]
            stops = [self._begin_stop(r, "config_removed") for r in records if r.running]
            for record in records:
                self.records.pop(record.id, None)
            self._refresh_gauges()
        await asyncio.gather(*stops, return_exceptions=True)

    # --- loading ------------------------------------------------------------------------

    def _ensure_loading(self, record: ModelRecord) -> asyncio.Task[None]:
        if record.load_task is None:
            task = asyncio.create_task(self._load(record), name=f"load:{record.id}")
            task.add_done_callback(_consume_exception)
            record.load_task = task
        return record.load_task

    async def _load(self, record: ModelRecord) -> None:
        started = time.monotonic()
        outcome = "failed"
        try:
            # Reads the model's config.json for the head-count rule: off the event loop.
            options = await anyio.to_thread.run_sync(
                resolve_load_options, record.served, self.settings
            )
            async with self._lock:
                block = self._claim(record, options.width)
                record.state, record.error, record.config_pending = "loading", None, False
                waits = [self._device_stops[i] for i in block if i in self._device_stops]
                self._refresh_gauges()
            if waits:
                await asyncio.gather(*waits, return_exceptions=True)
            running = await self._launch(record, options)
            async with self._lock:
                record.running = running
                record.state = "ready"
                record.last_used = time.monotonic()
                record.pinned_backoff_s = 1.0
                self._refresh_gauges()
            self._spawn(self._watch(record, running), f"watch:{record.id}")
            outcome = "ready"
            self.metrics.load_duration.observe(time.monotonic() - started)
            _log.info("%s: ready on %s", record.id, ",".join(self.devices[i] for i in block))
        except BaseException as exc:
            outcome = _outcome(exc)
            async with self._lock:
                record.block = ()
                if isinstance(exc, asyncio.CancelledError):
                    record.state, record.error = "unloaded", None
                else:
                    record.state = "failed" if outcome != "placement_failed" else "unloaded"
                    record.error = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
                self._refresh_gauges()
            if record.pinned:
                self._keeper_wake.set()
            raise
        finally:
            record.load_task = None
            self.metrics.loads.labels(outcome=outcome).inc()

    def _claim(self, record: ModelRecord, width: int) -> tuple[int, ...]:
        """Place the model (evicting as the allocator says) and claim its block. Under lock."""
        now = time.monotonic()
        if self._placement_backoff.get(width, 0.0) > now:
            raise PlacementFailed(
                f"{record.id}: no block of {width} device(s) could be freed a moment ago; "
                "retry shortly",
                retry_after_s=1,
            )
        claims = [
            Claim(
                r.id,
                r.block[0],
                len(r.block),
                pinned=r.pinned,
                last_used=r.last_used,
                evictable=r.state == "ready",
            )
            for r in self.records.values()
            if r.block
        ]
        try:
            placement = place(len(self.devices), claims, width)
        except NoPlacement as exc:
            self._placement_backoff[width] = now + _PLACEMENT_BACKOFF_S
            self.metrics.placement_failures.inc()
            raise PlacementFailed(f"{record.id}: " + exc.describe(self.devices)) from None
        for victim in placement.evict:
            _log.info("%s: evicting %s to make room", record.id, victim)
            self._begin_stop(self.records[victim], "make_room")
        record.block = tuple(placement.indices)
        return record.block

    async def _launch(self, record: ModelRecord, options: LoadOptions) -> RunningEngine:
        reserved: set[int] = set()
        try:
            return await self._launch_on_free_ports(record, options, reserved)
        finally:
            self._reserved_ports -= reserved

    def _reserve_port(self, candidates: range, reserved: set[int]) -> int:
        """A free port of ``candidates``, held for this load until it returns. Synchronous:
        no other load can pick between the choice and the reservation."""
        port = ports.pick_port(candidates, self._ports_in_use())
        reserved.add(port)
        self._reserved_ports.add(port)
        return port

    async def _launch_on_free_ports(
        self, record: ModelRecord, options: LoadOptions, reserved: set[int]
    ) -> RunningEngine:
        nccl_port = options.nccl_port or self._reserve_port(ports.RENDEZVOUS_PORTS, reserved)
        if options.nccl_port:  # declared: keep the engine ports of other loads off it
            reserved.add(nccl_port)
            self._reserved_ports.add(nccl_port)
        last_error: LoadFailed | None = None
        for _ in range(_PORT_ATTEMPTS):
            port = self._reserve_port(ports.ENGINE_PORTS, reserved)
            plan = plan_launch(
                record.served,
                options,
                tuple(self.devices[i] for i in record.block),
                port=port,
                nccl_port=nccl_port,
                settings=self.settings,
            )
            engine = await EngineProcess.start(
                record.id, plan.argv, engine_env(self.base_env, plan), port
            )
            running = RunningEngine(engine, options, plan.nccl_port)
            # Hold the ports while the engine starts, so a parallel load picks others.
            record.running = running
            try:
                await engine.wait_ready(self.client, plan.health_path, options.startup_timeout_s)
                return running
            except PortInUse as exc:
                _log.warning("%s; retrying on another port", exc.message)
                last_error = exc
                await engine.stop(self.settings.engine_stop_grace_s)
                # Either port may be the taken one; a declared rendezvous port stays.
                if not options.nccl_port:
                    nccl_port = self._reserve_port(ports.RENDEZVOUS_PORTS, reserved)
            except BaseException:
                await asyncio.shield(engine.stop(self.settings.engine_stop_grace_s))
                raise
            finally:
                record.running = None
        assert last_error is not None
        raise LoadFailed(f"{last_error.message} ({_PORT_ATTEMPTS} ports tried)")

    def _ports_in_use(self) -> set[int]:
        used: set[int] = set(self._reserved_ports)
        for r in self.records.values():
            if r.running is not None:
                used.add(r.running.engine.port)
                if r.running.nccl_port is not None:
                    used.add(r.running.nccl_port)
        return used

    # --- stopping -----------------------------------------------------------------------

    def _begin_stop(self, record: ModelRecord, reason: str) -> asyncio.Task[None]:
        """Release the model's claim now; drain and stop its engine in the background.

        The returned task is also registered for each of its devices, so a load placed
        there waits for the engine to be gone. Call under the lock.
        """
        running, block = record.running, record.block
        record.running, record.block = None, ()
        if record.state in ("ready", "loading"):
            record.state = "unloaded"
        self._placement_backoff.clear()
        self.metrics.evictions.labels(reason=reason).inc()
        self._refresh_gauges()
        task = self._spawn(self._drain_and_stop(record.id, running), f"stop:{record.id}")
        for index in block:
            self._device_stops[index] = task
        task.add_done_callback(lambda t: self._forget_stop(t, block))
        return task

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(_consume_exception)
        return task

    async def _stop_crashed(self, running: RunningEngine) -> None:
        running.engine.stopping = True
        await running.engine.stop(self.settings.engine_stop_grace_s)

    def _forget_stop(self, task: asyncio.Task[None], block: tuple[int, ...]) -> None:
        for index in block:
            if self._device_stops.get(index) is task:
                del self._device_stops[index]

    async def _drain_and_stop(self, model_id: str, running: RunningEngine | None) -> None:
        if running is None:
            return
        running.engine.stopping = True
        if running.inflight:
            _log.info("%s: draining %d request(s)", model_id, running.inflight)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(running.idle.wait(), timeout=self.settings.drain_timeout_s)
        await running.engine.stop(self.settings.engine_stop_grace_s)

    async def _watch(self, record: ModelRecord, running: RunningEngine) -> None:
        """Mark the model failed and free its devices if its engine dies on its own."""
        code = await running.engine.exited
        if running.engine.stopping:
            return
        async with self._lock:
            if record.running is not running:
                return
            record.running, block = None, record.block
            record.block = ()
            record.state = "failed"
            record.error = (
                f"engine exited unexpectedly with code {code}; last output:\n"
                + running.engine.log_tail(8)
            )
            self._placement_backoff.clear()
            self.metrics.evictions.labels(reason="engine_exit").inc()
            self._refresh_gauges()
            stop = self._spawn(self._stop_crashed(running), f"reap:{record.id}")
            for index in block:
                self._device_stops[index] = stop
            stop.add_done_callback(lambda t: self._forget_stop(t, block))
        _log.error("%s: %s", record.id, record.error)
        if record.pinned:
            self._keeper_wake.set()

    # --- leases and pins ----------------------------------------------------------------

    def _lease(self, record: ModelRecord, running: RunningEngine) -> Lease:
        running.inflight += 1
        running.idle.clear()
        record.last_used = time.monotonic()
        record.last_used_wall = time.time()
        self.metrics.inflight.labels(model=record.id).inc()

        def release() -> None:
            running.inflight -= 1
            record.last_used = time.monotonic()
            record.last_used_wall = time.time()
            self.metrics.inflight.labels(model=record.id).dec()
            if running.inflight == 0:
                running.idle.set()

        return Lease(
            model=record.id,
            base_url=running.engine.base_url,
            read_timeout_s=running.options.request_read_timeout_s,
            on_release=release,
        )

    async def _keep_pinned(self) -> None:
        while not self._closing:
            self._keeper_wake.clear()
            now = time.monotonic()
            next_try = now + _PINNED_BACKOFF_MAX_S
            for record in list(self.records.values()):
                if not record.pinned or record.state == "ready" or record.load_task:
                    continue
                if record.pinned_retry_at > now:
                    next_try = min(next_try, record.pinned_retry_at)
                    continue
                record.pinned_retry_at = now + record.pinned_backoff_s
                record.pinned_backoff_s = min(record.pinned_backoff_s * 2, _PINNED_BACKOFF_MAX_S)
                next_try = min(next_try, record.pinned_retry_at)
                self._ensure_loading(record)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._keeper_wake.wait(), timeout=next_try - now)

    def _refresh_gauges(self) -> None:
        counts = dict.fromkeys(STATES, 0)
        for record in self.records.values():
            counts[record.state] = counts.get(record.state, 0) + 1
        for state, count in counts.items():
            self.metrics.models.labels(state=state).set(count)
        self.metrics.devices_claimed.set(sum(len(r.block) for r in self.records.values()))


def _outcome(exc: BaseException) -> str:
    if isinstance(exc, asyncio.CancelledError):
        return "cancelled"
    if isinstance(exc, InvalidConfig):
        return "invalid_config"
    if isinstance(exc, SieError):
        return exc.code
    return "failed"


def _consume_exception(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()
