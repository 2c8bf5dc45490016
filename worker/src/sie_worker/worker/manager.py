"""Model lifecycle: unloaded -> loading -> ready | failed, on blocks the allocator picks.

Invariants kept here (and checked by the API tests):

- A device is claimed by at most one model; ``/v1/devices`` and ``/v1/models`` are two
  views of the same claims.
- Concurrent requests for one model share a single load; loads on disjoint blocks run in
  parallel (only the placement decision is serialised).
- An engine that a new load displaces (eviction, unload) drains its in-flight requests
  (bounded by ``drain_timeout_s``) and exits before the next engine starts on its devices.
- A failed load, a crash or an unload releases the model's devices at once
  (:meth:`ModelManager._release`, the one release sequence).
- A hub model's weights are fetched (:mod:`sie_worker.worker.weights.load_step`) before
  any device is claimed: a long download never holds GPUs that other models could serve
  on, and never evicts a model that serves until then. A dry run of the placement comes
  first, so a load that could not be placed fails at once instead of after the download.
  An unload, a removed config or a shutdown stops a download in progress.
- Pinned models are never evicted; the keeper reloads them (with backoff) when they fail.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

import anyio
import httpx

from sie_worker.config.loadtime import LoadOptions, resolve_load_options
from sie_worker.config.lora import BASE_ADAPTER
from sie_worker.config.model import ModelConfig, ServedModel, served_models
from sie_worker.errors import (
    InvalidConfig,
    LoadFailed,
    ModelLoading,
    PlacementFailed,
    SieError,
    UnknownModel,
)
from sie_worker.model_states import MODEL_STATES
from sie_worker.settings import Settings
from sie_worker.worker.launcher.plan import exports_metrics
from sie_worker.worker.launcher.process import start_group_guard
from sie_worker.worker.launcher.start import PortBook, start_engine
from sie_worker.worker.launcher.stops import EngineStops, consume_exception
from sie_worker.worker.metrics import (
    LOAD_OUTCOMES,
    LOAD_PHASES,
    EvictionReason,
    LoadOutcome,
    WorkerMetrics,
)
from sie_worker.worker.pin_keeper import PinKeeper
from sie_worker.worker.placement.allocator import Claim, NoPlacement, Placement, place
from sie_worker.worker.records import (
    Lease,
    ModelRecord,
    RunningEngine,
    adapter_entries,
    device_entries,
    model_entry,
    open_lease,
)
from sie_worker.worker.weights.cache import HubSettings
from sie_worker.worker.weights.hub_errors import DownloadCancelled
from sie_worker.worker.weights.load_step import ModelWeights

__all__ = ["ModelManager"]

_log = logging.getLogger("sie_worker.manager")
_PLACEMENT_BACKOFF_S = 0.5
# Loads one request may wait through before it gives up (the model can be evicted again
# between its load and the request's turn).
_ACQUIRE_ATTEMPTS = 3
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
        self._stops = EngineStops(settings)
        self._ports = PortBook(self._running_ports)
        self._placement_backoff: dict[int, float] = {}
        self._keeper = PinKeeper(self.records.values, self._ensure_loading)
        self._weights = ModelWeights(HubSettings.from_env(base_env), metrics, settings)
        for config in configs.values():
            self._add_config(config)
        for model_id in settings.pinned_models:
            self.record(model_id).pinned = True
        self._refresh_gauges()

    # --- lifecycle of the manager -----------------------------------------------------

    def start(self) -> None:
        """Start loading pinned models in the background (``/readyz`` waits for them)."""
        start_group_guard()
        self._keeper.start()

    async def shutdown(self) -> None:
        await self._keeper.stop()
        loads = [r.load_task for r in self.records.values() if r.load_task is not None]
        for task in loads:
            task.cancel()
        await asyncio.gather(*loads, return_exceptions=True)
        await self._weights.aclose()
        async with self._lock:
            stops = [
                self._release(r, "shutdown", drain=True)
                for r in self.records.values()
                if r.running is not None
            ]
        await asyncio.gather(*stops, return_exceptions=True)
        await self._stops.wait_all()

    @property
    def ready(self) -> bool:
        return all(r.state == "ready" for r in self.records.values() if r.pinned)

    # --- queries ------------------------------------------------------------------------

    def metric_sources(self) -> list[tuple[str, str]]:
        """``(model id, base URL)`` of every ready engine that exports its own metrics
        (SGLang's, started with ``--enable-metrics``), for the worker's /metrics."""
        return [
            (r.id, r.running.engine.base_url)
            for r in self.records.values()
            if r.state == "ready" and r.running is not None and exports_metrics(r.running.options)
        ]

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
        """Every served model, each followed by its LoRA adapters (``parent``: the model)."""
        entries = []
        for record in self.records.values():
            entry = model_entry(record, self.devices)
            entries += [entry, *adapter_entries(record, entry)]
        return entries

    def device_entries(self) -> list[dict[str, Any]]:
        return device_entries(self.records.values(), self.devices)

    # --- requests -----------------------------------------------------------------------

    async def acquire(
        self,
        model_id: str,
        *,
        started: float,
        wait_s: float | None = None,
        adapter: str = BASE_ADAPTER,
    ) -> Lease:
        """A lease on the model's ready engine, loading it first when needed. ``started``
        (monotonic) is when the request arrived: the lease's release, or a failure here,
        records the request's duration from then; ``adapter`` is its LoRA adapter's label."""
        record = self.record(model_id)
        try:
            return await self._acquire(record, started, wait_s, adapter)
        except SieError as error:
            seconds = time.monotonic() - started
            self.metrics.observe_request(model_id, str(error.status), seconds, adapter=adapter)
            raise

    async def _acquire(
        self, record: ModelRecord, started: float, wait_s: float | None, adapter: str
    ) -> Lease:
        for _ in range(_ACQUIRE_ATTEMPTS):
            running = record.running
            if record.state == "ready" and running is not None:
                return open_lease(record, running, self.metrics, started=started, adapter=adapter)
            task = self._ensure_loading(record)
            if wait_s is None:
                await _join_load(record.id, task)
                continue
            try:
                await asyncio.wait_for(_join_load(record.id, task), timeout=wait_s)
            except TimeoutError:
                raise ModelLoading(
                    f"{record.id} is loading; retry later or send no 'Prefer: wait' header",
                    retry_after_s=5,
                ) from None
        raise PlacementFailed(
            f"{record.id} was evicted again before it could serve; retry", retry_after_s=1
        )

    async def load(self, model_id: str) -> dict[str, Any]:
        record = self.record(model_id)
        while record.state != "ready" or record.running is None:
            await _join_load(record.id, self._ensure_loading(record))
        return self.model_entry(record)

    async def unload(self, model_id: str) -> dict[str, Any]:
        """Stop the model (after its load finishes, if loading) and clear its pin."""
        record = self.record(model_id)
        record.pinned = False
        await self._stop_loading(record)
        async with self._lock:
            stop = self._release(record, "requested", drain=True) if record.running else None
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

    def configs(self) -> dict[str, ModelConfig]:
        """Every config served here, by sie_id."""
        return {r.served.config.sie_id: r.served.config for r in self.records.values()}

    def _add_config(self, config: ModelConfig) -> None:
        for served in served_models(config):
            self.records[served.id] = ModelRecord(served)

    def _records_of(self, sie_id: str) -> Iterable[ModelRecord]:
        return [r for r in self.records.values() if r.served.config.sie_id == sie_id]

    async def _remove(self, records: list[ModelRecord]) -> None:
        served = {r.id: r.served for r in records}
        for record in records:
            record.pinned = False
            await self._stop_loading(record)
        async with self._lock:
            # A PUT that wrote this config again while we waited has the last word: the
            # file is its, so keep its models (they then follow the live-change rule).
            records = [
                r for r in records if self.records.get(r.id) is r and r.served is served[r.id]
            ]
            stops = [self._release(r, "config_removed", drain=True) for r in records if r.running]
            for record in records:
                self.records.pop(record.id, None)
            self._refresh_gauges()
        await asyncio.gather(*stops, return_exceptions=True)

    # --- loading ------------------------------------------------------------------------

    def _ensure_loading(self, record: ModelRecord) -> asyncio.Task[None]:
        if record.load_task is None:
            task = asyncio.create_task(self._load(record), name=f"load:{record.id}")
            task.add_done_callback(consume_exception)
            record.load_task = task
        return record.load_task

    async def _load(self, record: ModelRecord) -> None:
        started = time.monotonic()
        outcome: LoadOutcome = "failed"
        # The config this load uses throughout; a config written meanwhile stays pending.
        served, record.config_pending = record.served, False
        try:
            # Reads the model's config.json for the head-count rule: off the event loop.
            options = await anyio.to_thread.run_sync(resolve_load_options, served, self.settings)
            if options.model_path is None and self.settings.weights_download == "worker":
                options = await self._fetch_weights(record, served, options)
            async with self._lock:
                block = self._claim(record, options.width)
                record.state, record.error, record.phase = "loading", None, "starting"
                waits = self._stops.pending_on(block)
                self._refresh_gauges()
            if waits:
                await asyncio.gather(*waits, return_exceptions=True)
            with self._ports.booking() as booking:
                running = await start_engine(
                    served,
                    options,
                    tuple(self.devices[i] for i in block),
                    booking=booking,
                    settings=self.settings,
                    base_env=self.base_env,
                    client=self.client,
                )
                async with self._lock:  # registered before its ports' bookings end
                    record.running = running
                    record.state, record.phase, record.download = "ready", None, None
                    record.last_used = time.monotonic()
                    record.pinned_backoff_s = 1.0
                    self._refresh_gauges()
            self._stops.spawn(self._watch(record, running), f"watch:{record.id}")
            outcome = "ready"
            self.metrics.load_duration.observe(time.monotonic() - started)
            _log.info("%s: ready on %s", record.id, ",".join(self.devices[i] for i in block))
        except BaseException as exc:
            outcome = _outcome(exc)
            async with self._lock:
                record.block, record.phase, record.download = (), None, None
                if isinstance(exc, asyncio.CancelledError):
                    record.state, record.error = "unloaded", None
                else:
                    record.state = "failed" if outcome != "placement_failed" else "unloaded"
                    record.error = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
                self._refresh_gauges()
            if record.pinned:
                self._keeper.wake()
            raise
        finally:
            record.load_task = None
            self.metrics.count_load(outcome)

    async def _fetch_weights(
        self, record: ModelRecord, served: ServedModel, options: LoadOptions
    ) -> LoadOptions:
        """The download step, before any device is claimed (:mod:`.weights.load_step`)."""
        async with self._lock:
            self._placement(record, options.width)  # refuse now what could not be placed
            handle = self._weights.join(served)
            record.state, record.error, record.phase = "loading", None, "downloading"
            record.download = handle.progress
            self._refresh_gauges()
        return await self._weights.local_options(record.id, served, handle)

    async def _stop_loading(self, record: ModelRecord) -> None:
        """Let the model's load end: a download is stopped, an engine start is awaited."""
        task = record.load_task
        if task is None:
            return
        if record.phase == "downloading":
            task.cancel()
        await asyncio.wait([task])

    def _placement(self, record: ModelRecord, width: int) -> Placement:
        """Where the model would go now (which block, which evictions). Under lock. Raises
        :class:`PlacementFailed` when no block can be freed."""
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
        return placement

    def _claim(self, record: ModelRecord, width: int) -> tuple[int, ...]:
        """Place the model (evicting as the allocator says) and claim its block. Under lock."""
        placement = self._placement(record, width)
        for victim in placement.evict:
            _log.info("%s: evicting %s to make room", record.id, victim)
            self._release(self.records[victim], "make_room", drain=True)
        record.block = tuple(placement.indices)
        return record.block

    def _running_ports(self) -> set[int]:
        return {p for r in self.records.values() if r.running is not None for p in r.running.ports}

    # --- releasing ----------------------------------------------------------------------

    def _release(
        self,
        record: ModelRecord,
        reason: EvictionReason,
        *,
        drain: bool,
        failure: str | None = None,
    ) -> asyncio.Task[None]:
        """Release the model's claim now; stop its engine in the background (after draining
        its in-flight requests when ``drain``). The model turns ``failed`` with ``failure``
        as its error when given, else ``unloaded``. Call under the lock.

        The returned task is registered for each of the model's devices, so a load placed
        there waits for the engine to be gone.
        """
        running, block = record.running, record.block
        record.running, record.block = None, ()
        if failure is not None:
            record.state, record.error = "failed", failure
        elif record.state in ("ready", "loading"):
            record.state = "unloaded"
        self._placement_backoff.clear()
        self.metrics.count_eviction(reason)
        self._refresh_gauges()
        return self._stops.stop(record.id, running, block, drain=drain)

    async def _watch(self, record: ModelRecord, running: RunningEngine) -> None:
        """Mark the model failed and free its devices if its engine dies on its own."""
        code = await running.engine.exited
        if running.engine.stopping:
            return
        async with self._lock:
            if record.running is not running:
                return
            failure = (
                f"engine exited unexpectedly with code {code}; last output:\n"
                + running.engine.log_tail(8)
            )
            self._release(record, "engine_exit", drain=False, failure=failure)
        _log.error("%s: %s", record.id, record.error)
        if record.pinned:
            self._keeper.wake()

    def _refresh_gauges(self) -> None:
        counts = dict.fromkeys(MODEL_STATES, 0)
        for record in self.records.values():
            counts[record.state] += 1
        for state, count in counts.items():
            self.metrics.models.labels(state=state).set(count)
        self.metrics.set_model_states({r.id: r.state for r in self.records.values()})
        phases = dict.fromkeys(LOAD_PHASES, 0)
        for record in self.records.values():
            if record.state == "loading" and record.phase is not None:
                phases[record.phase] += 1
        for phase, count in phases.items():
            self.metrics.loading.labels(phase=phase).set(count)
        self.metrics.devices_claimed.set(sum(len(r.block) for r in self.records.values()))


async def _join_load(model_id: str, task: asyncio.Task[None]) -> None:
    """Wait for a load without cancelling it; a load stopped by an unload (rather than this
    waiter being cancelled) is a :class:`LoadFailed`."""
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if task.cancelled() and (current is None or not current.cancelling()):
            raise LoadFailed(
                f"{model_id}: its load was stopped (unloaded or its config changed while its "
                "weights downloaded); send the request again to load it"
            ) from None
        raise


def _outcome(exc: BaseException) -> LoadOutcome:
    """The load's outcome label: one of :data:`LOAD_OUTCOMES`, ``failed`` for any other."""
    if isinstance(exc, (asyncio.CancelledError, DownloadCancelled)):
        return "cancelled"
    if isinstance(exc, InvalidConfig):
        return "invalid_config"
    if isinstance(exc, SieError):
        return next((o for o in LOAD_OUTCOMES if o == exc.code), "failed")
    return "failed"
