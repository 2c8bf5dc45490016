"""One model load, from its options to a ready engine, and what it leaves when it fails.

The sequence:

1. resolve the load-time options (off the event loop: they read config.json);
2. a hub model's weights are fetched first (:mod:`sie_worker.worker.weights.load_step`), after
   a dry run of the placement, so a load that could not be placed fails at once and a long
   download holds no devices and evicts nobody;
3. the model's need on each device (:func:`~sie_worker.worker.placement.claims.need_of`);
4. under the lock: place it, evict what the allocator says, claim its block and memory;
5. wait for the engines leaving those devices, then start the engine, one start at a time
   per device: the free memory is measured and the engine's share computed just before it
   starts (SGLang takes its fraction of the memory free then);
6. a start that runs out of device memory evicts one more unpinned model on that device and
   tries once more;
7. ready: the engine is registered and watched. A failure moves the model to ``failed``
   (``unloaded`` when cancelled or refused for room) and frees its claim at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping

import anyio
import httpx

from sie_worker.config.load.load_options import LoadOptions
from sie_worker.config.load.loadtime import resolve_load_options
from sie_worker.config.model import ServedModel
from sie_worker.errors import InvalidConfig, LoadFailed, SieError
from sie_worker.settings import Settings
from sie_worker.sizing.memory_needs import EngineShare, NoRoomAtStart
from sie_worker.worker.launcher.process import OutOfMemory
from sie_worker.worker.launcher.start import PortBook, RunningEngine, StartGate, start_engine
from sie_worker.worker.metrics import LOAD_OUTCOMES, LoadOutcome
from sie_worker.worker.model_table import ModelTable
from sie_worker.worker.placement.claims import need_of, share_at_start
from sie_worker.worker.records import ModelRecord
from sie_worker.worker.weights.hub_errors import DownloadCancelled
from sie_worker.worker.weights.load_step import ModelWeights

__all__ = ["Loader", "load_outcome"]

_log = logging.getLogger("sie_worker.manager")


class Loader:
    """Runs loads for the records of ``table``."""

    def __init__(
        self,
        table: ModelTable,
        settings: Settings,
        client: httpx.AsyncClient,
        base_env: Mapping[str, str],
        weights: ModelWeights,
    ) -> None:
        self._table = table
        self._settings = settings
        self._client = client
        self._base_env = base_env
        self._weights = weights
        self._ports = PortBook(table.running_ports)
        self._gate = StartGate()

    async def load(self, record: ModelRecord) -> None:
        """Load ``record``'s model until its engine is ready; raise what stopped it."""
        table, started = self._table, time.monotonic()
        outcome: LoadOutcome = "failed"
        # The config this load uses throughout; a config written meanwhile stays pending.
        served, record.config_pending = record.served, False
        try:
            # Loading from the moment the load is taken: resolving its options and measuring
            # its memory (threads, weight files read) come before any placement, and a
            # model shown "unloaded" then would send the router, and a client's poll, on
            # the wrong track.
            async with table.lock:
                if record.state != "loading":
                    table.life.move(record, "loading", "load", phase="starting")
            options = await anyio.to_thread.run_sync(resolve_load_options, served, self._settings)
            if options.model_path is None and self._settings.weights_download == "worker":
                options = await self._fetch_weights(record, served, options)
            on_cpu = not self._settings.devices[0].startswith("cuda")
            need = await anyio.to_thread.run_sync(
                lambda: need_of(options, table.placer.memory, on_cpu=on_cpu)
            )
            running = await self._start(record, served, options, need)
            table.stops.spawn(table.watch(record, running), f"watch:{record.id}")
            outcome = "ready"
            table.metrics.load_duration.observe(time.monotonic() - started)
            devices = ",".join(self._settings.devices[i] for i in record.block)
            _log.info("%s: ready on %s", record.id, devices)
        except BaseException as exc:
            outcome = load_outcome(exc)
            async with table.lock:
                if isinstance(exc, asyncio.CancelledError):
                    table.life.move(record, "unloaded", "cancelled")
                else:
                    error = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
                    if outcome == "placement_failed":
                        table.life.move(record, "unloaded", outcome, error=error)
                    else:
                        table.life.move(record, "failed", outcome, error=error)
            raise
        finally:
            table.metrics.count_load(outcome)

    async def _fetch_weights(
        self, record: ModelRecord, served: ServedModel, options: LoadOptions
    ) -> LoadOptions:
        """The download step, before any device is claimed."""
        table = self._table
        async with table.lock:
            # Refuse now what could not be placed; the need is not known before the weights
            # are (the default engine's), so the smallest one is tried.
            dry_need = 0 if table.placer.memory.known else None
            table.placer.place(record, table.records.values(), options.claim_width, dry_need)
            handle = self._weights.join(served)
            table.life.move(record, "loading", "load", phase="downloading")
            record.download = handle.progress
        return await self._weights.local_options(record.id, served, handle)

    async def _start(
        self, record: ModelRecord, served: ServedModel, options: LoadOptions, need: int | None
    ) -> RunningEngine:
        table = self._table
        async with table.lock:
            block = self._claim(record, options.claim_width, need)
            waits = table.stops.pending_on(block)
        if waits:
            await asyncio.gather(*waits, return_exceptions=True)
        for attempt in (1, 2):
            try:
                return await self._start_once(record, served, options, block)
            except (OutOfMemory, NoRoomAtStart) as exc:
                problem = exc.message if isinstance(exc, SieError) else f"the engine {exc}"
                if attempt == 2 or not await self._evict_one_more(record, block):
                    raise LoadFailed(
                        f"{record.id}: not enough device memory on "
                        f"{','.join(self._settings.devices[i] for i in block)}: {problem}; "
                        "lower mem_fraction_static (or memory_gib), or unload a model there"
                    ) from None
                _log.warning("%s: %s; evicted one more model, starting again", record.id, problem)
        raise AssertionError("unreachable")  # pragma: no cover

    def _claim(self, record: ModelRecord, width: int, need: int | None) -> tuple[int, ...]:
        """Place the model (evicting as the allocator says) and claim its block and memory.
        Under lock."""
        table = self._table
        placement = table.placer.place(record, table.records.values(), width, need)
        for victim in placement.evict:
            _log.info("%s: evicting %s to make room", record.id, victim)
            table.release(table.records[victim], "make_room", drain=True)
        table.life.move(record, "loading", "placed", phase="starting")
        record.block, record.memory = tuple(placement.indices), need
        record.placed_at = time.monotonic()
        table.refresh_gauges()
        return record.block

    async def _start_once(
        self, record: ModelRecord, served: ServedModel, options: LoadOptions, block: tuple[int, ...]
    ) -> RunningEngine:
        table, settings = self._table, self._settings
        async with self._gate.hold(block):
            share = self._share(record, options, block)
            with self._ports.booking() as booking:
                running = await start_engine(
                    served,
                    options,
                    tuple(settings.devices[i] for i in block),
                    booking=booking,
                    settings=settings,
                    base_env=self._base_env,
                    client=self._client,
                    share=share,
                )
                try:
                    async with table.lock:  # registered before its ports' bookings end
                        record.running = running
                        table.life.move(record, "ready", "engine ready")
                        record.last_used = time.monotonic()
                        record.pinned_backoff_s = 1.0
                except BaseException:
                    # Cancelled before it was registered: nobody else would ever stop it.
                    if record.running is not running:
                        await asyncio.shield(running.engine.stop(settings.engine_stop_grace_s))
                    raise
        return running

    def _share(
        self, record: ModelRecord, options: LoadOptions, block: tuple[int, ...]
    ) -> EngineShare | None:
        """The engine's memory share (None: the declared options as they are). Raises
        :class:`NoRoomAtStart` when a device has less free than the engine will take."""
        table, memory = self._table, self._table.placer.memory
        totals = [memory.totals[i] for i in block]
        if record.memory is None or any(t is None for t in totals):
            return None
        frees = [
            memory.free_at_start(
                i, table.placer.reserved(i, table.records.values(), other_than=record)
            )
            for i in block
        ]
        on_cuda = self._settings.devices[block[0]].startswith("cuda")
        return share_at_start(
            record.served,
            options,
            on_cuda=on_cuda,
            need=record.memory,
            totals=totals,
            frees=[f or 0 for f in frees],
        )

    async def _evict_one_more(self, record: ModelRecord, block: tuple[int, ...]) -> bool:
        """Evict the least recently used unpinned ready model sharing ``block`` with the
        record, and wait for its engine to be gone; False when there is none."""
        table = self._table
        async with table.lock:
            others = [
                r
                for r in table.records.values()
                if r is not record
                and r.state == "ready"
                and not r.pinned
                and set(r.block) & set(block)
            ]
            if not others:
                return False
            victim = min(others, key=lambda r: (r.last_used, r.id))
            _log.info("%s: out of device memory; evicting %s", record.id, victim.id)
            stop = table.release(victim, "make_room", drain=True)
        await asyncio.gather(stop, return_exceptions=True)
        return True


def load_outcome(exc: BaseException) -> LoadOutcome:
    """The ``outcome`` label of ``sie_model_loads_total`` for a load that raised ``exc``: one
    of :data:`~sie_worker.worker.metrics.LOAD_OUTCOMES`, ``failed`` for any other."""
    if isinstance(exc, asyncio.CancelledError | DownloadCancelled):
        return "cancelled"
    if isinstance(exc, InvalidConfig):
        return "invalid_config"
    if isinstance(exc, SieError):
        return next((o for o in LOAD_OUTCOMES if o == exc.code), "failed")
    return "failed"
