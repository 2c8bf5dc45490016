"""The worker's Prometheus metrics, on a registry of its own (one per app, so tests stay apart)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from sie_worker.model_states import MODEL_STATES, ModelState

__all__ = ["LOAD_PHASES", "DownloadTrack", "WorkerMetrics"]

LOAD_PHASES = ("downloading", "starting")
_LOAD_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 900, 1800)


class _Progress(Protocol):
    @property
    def done(self) -> int: ...
    @property
    def total(self) -> int | None: ...


@dataclass
class DownloadTrack:
    """How one model's weight fetch ended: ``downloaded`` or ``cached`` once set; a fetch
    that raised counts as ``failed`` (``cancelled`` when it was cancelled)."""

    outcome: str = "failed"


class WorkerMetrics:
    def __init__(
        self,
        devices: Sequence[str],
        memory_totals: Sequence[int | None] | None = None,
        memory_budgets: Sequence[int | None] | None = None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._device_names = tuple(devices)
        self.devices = Gauge("sie_devices", "Devices this worker owns (SIE_DEVICES).", registry=r)
        self.devices.set(len(devices))
        self.memory_total = Gauge(
            "sie_device_memory_total_bytes",
            "Memory of each device (NVML, the cgroup, or SIE_FAKE_MEMORY_BUDGET); absent "
            "where unknown.",
            ["device"],
            registry=r,
        )
        self.memory_budget = Gauge(
            "sie_device_memory_budget_bytes",
            "What models may reserve on each device: its total x "
            "SIE_MEMORY_PRESSURE_THRESHOLD_PERCENT / 100; absent where unknown.",
            ["device"],
            registry=r,
        )
        self.memory_reserved = Gauge(
            "sie_device_memory_reserved_bytes",
            "Memory the models placed on each device reserve (their needs).",
            ["device"],
            registry=r,
        )
        totals = memory_totals or [None] * len(devices)
        budgets = memory_budgets or [None] * len(devices)
        for name, total, budget in zip(devices, totals, budgets, strict=True):
            if total is not None:
                self.memory_total.labels(device=name).set(total)
            if budget is not None:
                self.memory_budget.labels(device=name).set(budget)
            self.memory_reserved.labels(device=name).set(0)
        self.devices_claimed = Gauge(
            "sie_devices_claimed",
            "Devices holding at least one loading or ready model.",
            registry=r,
        )
        self.models = Gauge("sie_models", "Served models by state.", ["state"], registry=r)
        for state in MODEL_STATES:
            self.models.labels(state=state).set(0)
        self.loading = Gauge(
            "sie_models_loading",
            "Loading models by phase: downloading (weights) or starting (engine).",
            ["phase"],
            registry=r,
        )
        for phase in LOAD_PHASES:
            self.loading.labels(phase=phase).set(0)
        self.download_bytes = Gauge(
            "sie_model_download_bytes",
            "Bytes of the model's weights in the cache, while they download.",
            ["model"],
            registry=r,
        )
        self.download_size = Gauge(
            "sie_model_download_size_bytes",
            "Bytes of the model's weights, while they download (once known).",
            ["model"],
            registry=r,
        )
        self.downloads = Counter(
            "sie_model_downloads",
            "Weight fetches by outcome: downloaded, cached (complete in the cache, no "
            "network), failed, cancelled.",
            ["outcome"],
            registry=r,
        )
        self.download_duration = Histogram(
            "sie_model_download_duration_seconds",
            "Time to fetch a model's weights (cached ones included).",
            buckets=_LOAD_BUCKETS,
            registry=r,
        )
        self.loads = Counter("sie_model_loads", "Model loads by outcome.", ["outcome"], registry=r)
        self.evictions = Counter(
            "sie_model_evictions",
            "Models stopped by reason: make_room (evicted for another load), requested "
            "(unload call), engine_exit (engine crashed), config_removed, shutdown.",
            ["reason"],
            registry=r,
        )
        self.load_duration = Histogram(
            "sie_model_load_duration_seconds",
            "Time from a load starting to the engine being ready (weight download included).",
            buckets=_LOAD_BUCKETS,
            registry=r,
        )
        self.placement_failures = Counter(
            "sie_placement_failures", "Loads refused because no block could be freed.", registry=r
        )
        self.inflight = Gauge(
            "sie_inflight_requests", "Requests being served, by model.", ["model"], registry=r
        )
        self.request_duration = Histogram(
            "sie_request_duration_seconds",
            "Inference request duration (to the last byte), by model, HTTP status and LoRA "
            "adapter (a declared adapter's name, else none).",
            ["model", "code", "adapter"],
            registry=r,
        )

    def record_models(
        self,
        states: Mapping[ModelState, int],
        phases: Mapping[str, int],
        reserved: Sequence[int],
        claimed: int,
    ) -> None:
        """The gauges of the models' states, loading phases, each device's reserved bytes
        and the devices holding a model."""
        self.devices_claimed.set(claimed)
        for state, count in states.items():
            self.models.labels(state=state).set(count)
        for phase, count in phases.items():
            self.loading.labels(phase=phase).set(count)
        for name, value in zip(self._device_names, reserved, strict=True):
            self.memory_reserved.labels(device=name).set(value)

    def observe_request(
        self, model: str, status: str, seconds: float, *, adapter: str = "none"
    ) -> None:
        """One request for ``model`` (``adapter``: its LoRA adapter's label) answered with
        HTTP ``status`` after ``seconds``."""
        self.request_duration.labels(model=model, code=status, adapter=adapter).observe(seconds)

    @contextlib.contextmanager
    def downloading(self, model: str, progress: _Progress) -> Iterator[DownloadTrack]:
        """Byte gauges for ``model`` while its weights are fetched (read from ``progress``
        at each scrape, removed afterwards), then the outcome and the duration."""
        self.download_bytes.labels(model=model).set_function(lambda: progress.done)
        self.download_size.labels(model=model).set_function(lambda: progress.total or 0)
        track, started = DownloadTrack(), time.monotonic()
        try:
            yield track
        except BaseException as exc:
            track.outcome = "cancelled" if isinstance(exc, asyncio.CancelledError) else "failed"
            raise
        finally:
            self.downloads.labels(outcome=track.outcome).inc()
            self.download_duration.observe(time.monotonic() - started)
            for gauge in (self.download_bytes, self.download_size):
                with contextlib.suppress(KeyError):
                    gauge.remove(model)

    def render(self) -> bytes:
        return generate_latest(self.registry)
