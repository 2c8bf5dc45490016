"""The worker's models: requests, loads, unloads, pins and configs, over one table of records.

Invariants kept here (and checked by the API tests):

- A group's devices hold nothing else; a device shared by width-1 models holds no more than
  its budget (:mod:`sie_worker.worker.placement.allocator`); ``/v1/devices`` and
  ``/v1/models`` are two views of the same claims.
- Concurrent requests for one model share a single load; loads on disjoint blocks run in
  parallel (only the placement decision is serialised, and engine starts per device).
- An engine that a new load displaces (eviction, unload) drains its in-flight requests
  (bounded by ``drain_timeout_s``) and exits before the next engine starts on its devices.
- A failed load, a crash or an unload releases the model's claim at once
  (:meth:`~sie_worker.worker.model_table.ModelTable.release`, the one release sequence).
- A model's state moves only through :class:`~sie_worker.worker.lifecycle.Lifecycle`; a
  load runs as :mod:`sie_worker.worker.loading` describes.
- Pinned models are never evicted; the keeper reloads them (with backoff) when they fail.
- On a group of nodes, :class:`~sie_worker.worker.group_role.GroupRole` decides who serves
  and ends the worker when a group model's engine rank ends.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

import httpx

from sie_worker.config.lora import BASE_ADAPTER
from sie_worker.config.model import ModelConfig, served_models
from sie_worker.errors import (
    LoadFailed,
    ModelLoading,
    PlacementFailed,
    SieError,
    StartupTimeout,
    UnknownModel,
)
from sie_worker.settings import Settings
from sie_worker.worker.group_role import GroupRole
from sie_worker.worker.group_watch import watch_peers
from sie_worker.worker.launcher.group_guard import start_group_guard
from sie_worker.worker.launcher.plan import exports_metrics
from sie_worker.worker.launcher.start import RunningEngine
from sie_worker.worker.launcher.stops import EngineStops, consume_exception
from sie_worker.worker.loading import Loader
from sie_worker.worker.metrics import WorkerMetrics
from sie_worker.worker.model_table import ModelTable
from sie_worker.worker.pin_keeper import PinKeeper
from sie_worker.worker.placement.claims import Placer, estimated_need
from sie_worker.worker.placement.memory import DeviceMemory
from sie_worker.worker.proxy import record_request
from sie_worker.worker.records import ModelRecord, adapter_entries, model_entry
from sie_worker.worker.weights.cache import HubSettings
from sie_worker.worker.weights.load_step import ModelWeights

__all__ = ["ModelManager"]

# Loads one request may wait through before it gives up (the model can be evicted again
# between its load and the request's turn).
_ACQUIRE_ATTEMPTS = 3
_log = logging.getLogger("sie_worker.manager")
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
        memory: DeviceMemory,
        group: GroupRole | None = None,
    ) -> None:
        self.settings = settings
        self.group = group or GroupRole(settings)
        self.devices = settings.devices
        self.metrics = metrics
        # Engines need no API key; one that prints its environment (or a crash dump that
        # does) would otherwise put the key in the worker's log.
        engine_env = {k: v for k, v in base_env.items() if k not in _ENGINE_WITHHELD_ENV}
        placer = Placer(settings.devices, memory, settings.placement_strategy, metrics)
        self._table = table = ModelTable(placer, EngineStops(settings), metrics)
        self.records = table.records
        self._weights = ModelWeights(HubSettings.from_env(base_env), metrics, settings)
        self._loader = Loader(table, settings, client, engine_env, self._weights)
        self._keeper = PinKeeper(self.records.values, self._ensure_loading)
        table.on_crash = self._crashed
        self._peer_watch: asyncio.Task[None] | None = None
        for config in configs.values():
            self._add_config(config)
        for model_id in settings.pinned_models:
            record = self.record(model_id)
            record.pinned = self.group.keeps_pinned(record.served)
        table.refresh_gauges()

    # --- lifecycle of the manager -----------------------------------------------------

    def start(self) -> None:
        """Start loading pinned models in the background (``/readyz`` waits for them), and on
        a group of nodes the watch on the other ranks."""
        start_group_guard()
        self._keeper.start()
        group = self.group
        if group.grouped and group.peers is None:
            _log.warning(
                "rank %d cannot watch the other ranks of its group: SIE_NODE_ADDRESSES is unset "
                "and SIE_LEADER_ADDRESS %r is no LeaderWorkerSet pod name; set "
                "SIE_NODE_ADDRESSES (every rank's worker, rank 0 first) so that a rank gone "
                "ends the group",
                group.rank,
                group.leader,
            )
        elif group.peers:
            task = asyncio.create_task(watch_peers(group.peers, self._peer_lost), name="peers")
            task.add_done_callback(_watch_ended)
            self._peer_watch = task

    async def _peer_lost(self, rank: int, why: str) -> None:
        """Another rank is gone: stop the group's engines here (requests in flight get an
        error at once), then end this worker."""
        table = self._table
        async with table.lock:
            for record in self.records.values():
                if record.running is not None and self.group.serves_group(record.served):
                    failure = f"lost rank {rank} of the group of nodes: {why}"
                    table.release(record, "engine_exit", drain=False, failure=failure)
        self.group.peer_lost(rank, why)

    async def shutdown(self) -> None:
        if self._peer_watch is not None:
            self._peer_watch.cancel()
            await asyncio.gather(self._peer_watch, return_exceptions=True)
        await self._keeper.stop()
        loads = [r.load_task for r in self.records.values() if r.load_task is not None]
        for task in loads:
            task.cancel()
        await asyncio.gather(*loads, return_exceptions=True)
        await self._weights.aclose()
        table = self._table
        async with table.lock:
            stops = [
                table.release(r, "shutdown", drain=True)
                for r in self.records.values()
                if r.running is not None
            ]
        await asyncio.gather(*stops, return_exceptions=True)
        await table.stops.wait_all()

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
            raise UnknownModel.not_configured(model_id)
        return record

    def model_entry(self, record: ModelRecord) -> dict[str, Any]:
        return model_entry(record, self.devices, memory_bytes=self._estimate(record))

    def model_entries(self) -> list[dict[str, Any]]:
        """Every served model, each followed by its LoRA adapters (``parent``: the model)."""
        entries = []
        for record in self.records.values():
            entry = self.model_entry(record)
            entries += [entry, *adapter_entries(record, entry)]
        return entries

    def _estimate(self, record: ModelRecord) -> int | None:
        """What the model would reserve (computed once per config: it may list files)."""
        if record.need_estimate is None or record.need_estimate[0] is not record.served:
            memory = self._table.placer.memory
            need = estimated_need(record.served, self.settings, memory)
            record.need_estimate = (record.served, need)
        return record.need_estimate[1]

    def device_entries(self) -> list[dict[str, Any]]:
        return self._table.placer.device_entries(self.records.values())

    # --- requests -----------------------------------------------------------------------

    async def hold(
        self,
        record: ModelRecord,
        *,
        started: float,
        wait_s: float | None = None,
        adapter: str = BASE_ADAPTER,
    ) -> RunningEngine:
        """The model's engine once it is ready, loading it first: the cold path of a request
        (a warm one finds ``record.running`` ready and opens its lease at once). ``started``
        (monotonic) is when the request arrived: a failure here records the request's
        duration from then; ``adapter`` is its LoRA adapter's label."""
        try:
            return await self._hold(record, wait_s)
        except SieError as error:
            seconds = time.monotonic() - started
            record_request(self.metrics, record.id, str(error.status), seconds, adapter=adapter)
            raise

    async def _hold(self, record: ModelRecord, wait_s: float | None) -> RunningEngine:
        for _ in range(_ACQUIRE_ATTEMPTS):
            running = record.running
            if record.state == "ready" and running is not None:
                return running
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
        self.group.require_leader()
        record = self.record(model_id)
        while record.state != "ready" or record.running is None:
            await _join_load(record.id, self._ensure_loading(record))
        return self.model_entry(record)

    async def unload(self, model_id: str) -> dict[str, Any]:
        """Stop the model (after its load finishes, if loading) and clear its pin."""
        self.group.require_leader()
        record = self.record(model_id)
        record.pinned = False
        await self._stop_loading(record)
        table = self._table
        stop: asyncio.Task[None] | None = None
        async with table.lock:
            if record.running is not None:
                stop = table.release(record, "requested", drain=True)
            elif record.load_task is None:  # else a request loads it again: that one wins
                table.life.move(record, "unloaded", "requested")
        if stop is not None:
            await stop
        return self.model_entry(record)

    async def pin(self, model_id: str) -> dict[str, Any]:
        self.group.require_leader()
        record = self.record(model_id)
        record.pinned = True
        record.pinned_backoff_s, record.pinned_retry_at = 1.0, 0.0
        return await self.load(model_id)

    async def unpin(self, model_id: str) -> dict[str, Any]:
        self.group.require_leader()
        record = self.record(model_id)
        record.pinned = False
        self._table.placer.forget_refusals()
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
                record.serve(served)
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
        table = self._table
        async with table.lock:
            # A PUT that wrote this config again while we waited has the last word: the
            # file is its, so keep its models (they then follow the live-change rule).
            records = [
                r for r in records if self.records.get(r.id) is r and r.served is served[r.id]
            ]
            stops = [table.release(r, "config_removed", drain=True) for r in records if r.running]
            for record in records:
                self.records.pop(record.id, None)
            table.refresh_gauges()
        await asyncio.gather(*stops, return_exceptions=True)

    # --- loading ------------------------------------------------------------------------

    def _ensure_loading(self, record: ModelRecord) -> asyncio.Task[None]:
        if record.load_task is None:
            task = asyncio.create_task(self._load(record), name=f"load:{record.id}")
            task.add_done_callback(consume_exception)
            record.load_task = task
        return record.load_task

    async def _load(self, record: ModelRecord) -> None:
        try:
            await self._loader.load(record)
        except (LoadFailed, StartupTimeout) as exc:
            if self.group.serves_group(record.served):
                self.group.engine_failed(record.id, exc.message)
            self._wake_if_pinned(record)
            raise
        except BaseException:
            self._wake_if_pinned(record)
            raise
        finally:
            record.load_task = None

    async def _stop_loading(self, record: ModelRecord) -> None:
        """Let the model's load end: a download is stopped, an engine start is awaited."""
        task = record.load_task
        if task is None:
            return
        if record.phase == "downloading":
            task.cancel()
        await asyncio.wait([task])

    def _crashed(self, record: ModelRecord) -> None:
        if self.group.serves_group(record.served):
            self.group.engine_failed(record.id, record.error or "its engine exited")
        self._wake_if_pinned(record)

    def _wake_if_pinned(self, record: ModelRecord) -> None:
        if record.pinned:
            self._keeper.wake()


def _watch_ended(task: asyncio.Task[None]) -> None:
    """The peer watch never ends on its own but for a lost peer: say why it did otherwise."""
    if not task.cancelled() and task.exception() is not None:
        _log.error("the watch on the group's other ranks ended: %r", task.exception())


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
