"""The worker's served models: their records, the lock over them, and the one release
sequence.

Every change of a record's claims happens under :attr:`ModelTable.lock`; its state moves only
through :attr:`ModelTable.life`. :meth:`ModelTable.release` ends a model's claim at once and
stops its engine in the background (after draining its requests when asked), so a load
placed on those devices first waits for the engine to be gone
(:meth:`~sie_worker.worker.launcher.stops.EngineStops.pending_on`). :meth:`watch` turns an
engine that exits on its own into a ``failed`` model that holds nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from sie_worker.model_states import MODEL_STATES
from sie_worker.worker.launcher.start import RunningEngine
from sie_worker.worker.launcher.stops import EngineStops
from sie_worker.worker.lifecycle import Lifecycle
from sie_worker.worker.metrics import LOAD_PHASES, EvictionReason, WorkerMetrics
from sie_worker.worker.placement.claims import Placer
from sie_worker.worker.records import ModelRecord

__all__ = ["ModelTable"]

_log = logging.getLogger("sie_worker.manager")


class ModelTable:
    """Records by served id, with what changes them."""

    def __init__(self, placer: Placer, stops: EngineStops, metrics: WorkerMetrics) -> None:
        self.records: dict[str, ModelRecord] = {}
        self.lock = asyncio.Lock()
        self.placer = placer
        self.stops = stops
        self.metrics = metrics
        self.life = Lifecycle(self.refresh_gauges)
        self.on_crash: Callable[[ModelRecord], None] = lambda record: None

    def release(
        self,
        record: ModelRecord,
        reason: EvictionReason,
        *,
        drain: bool,
        failure: str | None = None,
    ) -> asyncio.Task[None]:
        """End the model's claim now; stop its engine in the background (after its in-flight
        requests when ``drain``). The model turns ``failed`` with ``failure`` as its error
        when given, else ``unloaded``. Call under the lock. The returned task is registered
        for each of the model's devices."""
        running, block = record.running, record.block
        if failure is not None:
            self.life.move(record, "failed", reason, error=failure)
        else:
            self.life.move(record, "unloaded", reason)
        self.placer.forget_refusals()
        self.metrics.count_eviction(reason)
        return self.stops.stop(record.id, running, block, drain=drain)

    async def watch(self, record: ModelRecord, running: RunningEngine) -> None:
        """Mark the model failed and free its devices if its engine, or one of its ranks,
        dies on its own (any exit the worker did not ask for, status 0 included)."""
        why = await running.engine.ended
        if running.engine.stopping:
            return
        async with self.lock:
            if record.running is not running:
                return
            failure = f"{why}; last output:\n" + running.engine.log_tail(8)
            self.release(record, "engine_exit", drain=False, failure=failure)
        _log.error("%s: %s", record.id, record.error)
        self.on_crash(record)

    def running_ports(self) -> set[int]:
        return {p for r in self.records.values() if r.running is not None for p in r.running.ports}

    def refresh_gauges(self) -> None:
        counts = dict.fromkeys(MODEL_STATES, 0)
        phases = dict.fromkeys(LOAD_PHASES, 0)
        reserved = [0] * len(self.placer.devices)
        claimed: set[int] = set()
        for record in self.records.values():
            counts[record.state] += 1
            if record.state == "loading" and record.phase is not None:
                phases[record.phase] += 1
            for index in record.block:
                reserved[index] += record.memory or 0
            claimed.update(record.block)
        self.metrics.record_models(counts, phases, reserved, len(claimed))
        self.metrics.set_model_states({r.id: r.state for r in self.records.values()})
