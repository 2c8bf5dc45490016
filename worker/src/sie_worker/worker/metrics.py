"""The worker's Prometheus metrics, on a registry of its own (one per app, so tests stay apart).

Every labelled counter and histogram that an alert reads exists from the start, at zero, for
each value of its label (the tables below are the only lists of those values): ``increase()``
over a series that appears with its first event would miss that event.

Streams are timed where the worker relays them: :class:`StreamTimer` observes the time to
the first relayed write (``sie_time_to_first_token_seconds``) and between writes
(``sie_inter_token_latency_seconds``), one observation per write.

After them :meth:`WorkerMetrics.render` writes what an endpoint picker reads of the whole
worker (:mod:`sie_worker.model_server_series`): each ready model's engine load as its engine
reports it (SGLang's and vLLM's own series, read at this scrape); a ready model without one
(the default engine exports none, or its engine did not answer) counts the requests in
flight to it as running and none as waiting, with no KV cache use. ``running_lora_adapters``
lists the ready models, ``waiting_lora_adapters`` the loading ones, ``max_lora`` the devices.
Requests the worker holds for a model still loading are not counted as waiting (they show in
the router's ``sie_router_queued_requests``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal, Protocol, get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from sie_worker.model_server_series import ServerLoad, combine
from sie_worker.model_server_series import render as render_load
from sie_worker.model_states import MODEL_STATES, ModelState

__all__ = [
    "DOWNLOAD_OUTCOMES",
    "EVICTION_REASONS",
    "LOAD_OUTCOMES",
    "LOAD_PHASES",
    "DownloadOutcome",
    "DownloadTrack",
    "EvictionReason",
    "LoadOutcome",
    "StreamTimer",
    "WorkerMetrics",
]

LOAD_PHASES = ("downloading", "starting")
# How a load ended (sie_model_loads_total{outcome}): ready, or the code of the error it
# failed with; an error whose code is not listed counts as ``failed``.
LoadOutcome = Literal[
    "ready",
    "failed",
    "cancelled",
    "invalid_config",
    "placement_failed",
    "load_failed",
    "startup_timeout",
    "engine_unavailable",
]
LOAD_OUTCOMES: Final[tuple[LoadOutcome, ...]] = get_args(LoadOutcome)
# Why a model was stopped (sie_model_evictions_total{reason}).
EvictionReason = Literal["make_room", "requested", "engine_exit", "config_removed", "shutdown"]
EVICTION_REASONS: Final[tuple[EvictionReason, ...]] = get_args(EvictionReason)
# How a weight fetch ended (sie_model_downloads_total{outcome}).
DownloadOutcome = Literal["downloaded", "cached", "failed", "cancelled"]
DOWNLOAD_OUTCOMES: Final[tuple[DownloadOutcome, ...]] = get_args(DownloadOutcome)
_LOAD_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 900, 1800)
# Time to first token: from the request's arrival at the worker to its first relayed event.
_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
# Between two relayed writes of a stream (a write carries every event that had arrived).
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class _Progress(Protocol):
    @property
    def done(self) -> int: ...
    @property
    def total(self) -> int | None: ...


@dataclass
class DownloadTrack:
    """How one model's weight fetch ended: ``downloaded`` or ``cached`` once set; a fetch
    that raised counts as ``failed`` (``cancelled`` when it was cancelled)."""

    outcome: DownloadOutcome = "failed"


class _Observer(Protocol):
    def observe(self, amount: float) -> None: ...


class StreamTimer:
    """Times one relayed stream: call :meth:`chunk` with ``time.monotonic()`` at each write
    to the client. The first write observes the time to first token since ``started`` (the
    request's arrival), each later one the gap since the previous write."""

    __slots__ = ("_itl", "_last", "_ttft")

    def __init__(self, ttft: _Observer, itl: _Observer, started: float) -> None:
        self._ttft: _Observer | None = ttft
        self._itl, self._last = itl, started

    def chunk(self, now: float) -> None:
        if self._ttft is not None:
            self._ttft.observe(now - self._last)
            self._ttft = None
        else:
            self._itl.observe(now - self._last)
        self._last = now


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
        self.model_state = Gauge(
            "sie_model_state",
            "1 for the state each served model is in, 0 for the others.",
            ["model", "state"],
            registry=r,
        )
        self._model_states: dict[str, str] = {}
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
        for outcome in DOWNLOAD_OUTCOMES:
            self.downloads.labels(outcome=outcome)
        self.download_duration = Histogram(
            "sie_model_download_duration_seconds",
            "Time to fetch a model's weights (cached ones included).",
            buckets=_LOAD_BUCKETS,
            registry=r,
        )
        self.loads = Counter(
            "sie_model_loads",
            "Model loads by outcome: ready, or the code of the error the load failed with.",
            ["outcome"],
            registry=r,
        )
        for load_outcome in LOAD_OUTCOMES:
            self.loads.labels(outcome=load_outcome)
        self.evictions = Counter(
            "sie_model_evictions",
            "Models stopped by reason: make_room (evicted for another load), requested "
            "(unload call), engine_exit (engine crashed), config_removed, shutdown.",
            ["reason"],
            registry=r,
        )
        for reason in EVICTION_REASONS:
            self.evictions.labels(reason=reason)
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
        self.ttft = Histogram(
            "sie_time_to_first_token_seconds",
            "Streams: time from the request's arrival to its first relayed event, by model.",
            ["model"],
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "sie_inter_token_latency_seconds",
            "Streams: time between two relayed writes of events, by model.",
            ["model"],
            buckets=_ITL_BUCKETS,
            registry=r,
        )

    def stream_timer(self, model: str, started: float) -> StreamTimer:
        """A timer for one stream of ``model`` that arrived at ``started`` (monotonic)."""
        return StreamTimer(self.ttft.labels(model=model), self.itl.labels(model=model), started)

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

    def set_model_states(self, states: Mapping[str, str]) -> None:
        """Each served model's state (``sie_model_state``); models no longer served go."""
        for model in self._model_states.keys() - states.keys():
            for state in MODEL_STATES:
                with contextlib.suppress(KeyError):
                    self.model_state.remove(model, state)
        for model, current in states.items():
            if self._model_states.get(model) != current:
                for state in MODEL_STATES:
                    self.model_state.labels(model=model, state=state).set(state == current)
        self._model_states = dict(states)

    def count_load(self, outcome: LoadOutcome) -> None:
        self.loads.labels(outcome=outcome).inc()

    def count_eviction(self, reason: EvictionReason) -> None:
        self.evictions.labels(reason=reason).inc()

    def server_load(self, engines: Mapping[str, ServerLoad]) -> ServerLoad:
        """The whole worker's load, given its engines' (by model; see the module's doc)."""
        inflight = {s.labels["model"]: s.value for m in self.inflight.collect() for s in m.samples}
        ready = [m for m, state in self._model_states.items() if state == "ready"]
        return combine(
            [
                *(engines.get(m) or ServerLoad(running=inflight.get(m, 0.0)) for m in ready),
                ServerLoad(
                    ready=frozenset(ready),
                    loading=frozenset(
                        m for m, state in self._model_states.items() if state == "loading"
                    ),
                    max_lora=len(self._device_names),
                ),
            ]
        )

    def render(self, engines: Mapping[str, ServerLoad] | None = None) -> bytes:
        """The worker's own series, then its model-server series (``engines``: the loads its
        engines reported at this scrape, by model)."""
        return generate_latest(self.registry) + render_load(self.server_load(engines or {}))
