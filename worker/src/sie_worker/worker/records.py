"""What the worker knows about each served model, the leases requests hold on its engine,
and the API's views of both.

:class:`ModelRecord` is one served model's state (claims, engine, pin, errors); the
:class:`~sie_worker.worker.manager.ModelManager` changes records. A :class:`Lease` is one
request's hold on a ready engine: it counts the request in flight while it lasts and, when
released (once), records its status and duration. :func:`model_entry` and
:func:`device_entries` render records for ``/v1/models`` and ``/v1/devices`` from the same
claims, so the two views always agree.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from sie_worker.config.loadtime import LoadOptions, declared_width
from sie_worker.config.lora import BASE_ADAPTER, lora_adapters
from sie_worker.config.model import ServedModel
from sie_worker.model_states import ModelState
from sie_worker.worker.launcher.process import EngineProcess
from sie_worker.worker.metrics import StreamTimer, WorkerMetrics
from sie_worker.worker.weights.progress import Progress

__all__ = [
    "Lease",
    "LoadPhase",
    "ModelRecord",
    "RunningEngine",
    "adapter_entries",
    "device_entries",
    "model_entry",
    "open_lease",
]

# Where a loading model is: fetching its weights (no devices claimed yet), or starting its
# engine on its claimed block.
LoadPhase = Literal["downloading", "starting"]


@dataclass
class RunningEngine:
    """An engine serving a model, with the requests it is serving."""

    engine: EngineProcess
    options: LoadOptions
    nccl_port: int | None
    inflight: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.idle.set()

    @property
    def ports(self) -> set[int]:
        """The ports this engine holds (HTTP, and rendezvous when it has one)."""
        return {self.engine.port} | ({self.nccl_port} if self.nccl_port is not None else set())


@dataclass
class ModelRecord:
    served: ServedModel
    state: ModelState = "unloaded"
    block: tuple[int, ...] = ()
    pinned: bool = False
    error: str | None = None
    last_used: float = 0.0  # monotonic, for placement
    last_used_wall: float | None = None
    running: RunningEngine | None = None
    load_task: asyncio.Task[None] | None = None
    config_pending: bool = False
    phase: LoadPhase | None = None  # while state is "loading"
    download: Progress | None = None  # the weights being fetched, while loading
    pinned_retry_at: float = 0.0
    pinned_backoff_s: float = 1.0

    @property
    def id(self) -> str:
        return self.served.id

    def touch(self) -> None:
        self.last_used = time.monotonic()
        self.last_used_wall = time.time()


@dataclass
class Lease:
    """A claim on a ready engine for one request; :meth:`release` ends it (idempotent)."""

    model: str
    base_url: str
    read_timeout_s: float | None
    on_release: Callable[[], None] = field(repr=False)
    status: str = "error"  # the HTTP status the client got, for metrics
    # Times a streamed answer's writes (TTFT, inter-token latency); None: not measured.
    timer: StreamTimer | None = field(default=None, repr=False)
    _released: bool = field(default=False, repr=False)

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.on_release()


def open_lease(
    record: ModelRecord,
    running: RunningEngine,
    metrics: WorkerMetrics,
    *,
    started: float,
    adapter: str = BASE_ADAPTER,
) -> Lease:
    """Count one request in flight on ``running`` until the lease is released; the release
    records the request's status and its duration since ``started`` (monotonic)."""
    running.inflight += 1
    running.idle.clear()
    record.touch()
    metrics.inflight.labels(model=record.id).inc()
    lease = Lease(
        model=record.id,
        base_url=running.engine.base_url,
        read_timeout_s=running.options.request_read_timeout_s,
        on_release=lambda: None,
        timer=metrics.stream_timer(record.id, started),
    )

    def release() -> None:
        running.inflight -= 1
        record.touch()
        metrics.inflight.labels(model=record.id).dec()
        if running.inflight == 0:
            running.idle.set()
        seconds = time.monotonic() - started
        metrics.observe_request(record.id, lease.status, seconds, adapter=adapter)

    lease.on_release = release
    return lease


def model_entry(record: ModelRecord, devices: Sequence[str]) -> dict[str, Any]:
    """The record as ``/v1/models`` shows it; ``phase`` and the byte counts are set only
    while the model loads (the bytes only when its weights are fetched)."""
    running = record.running
    loading = record.state == "loading"
    download = record.download if loading else None
    return {
        "id": record.id,
        "object": "model",
        "owned_by": "sie",
        "state": record.state,
        "devices": [devices[i] for i in record.block],
        "width": running.options.width if running else declared_width(record.served),
        "pinned": record.pinned,
        "error": record.error,
        "last_used": record.last_used_wall,
        "inflight": running.inflight if running else 0,
        "config_pending": record.config_pending,
        "phase": record.phase if loading else None,
        "bytes_done": download.done if download else None,
        "bytes_total": download.total if download else None,
    }


def adapter_entries(record: ModelRecord, entry: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One ``/v1/models`` entry per LoRA adapter of the record's profile, as vLLM lists
    them: ``id`` ``<served id>:<adapter>``, ``parent`` the served id, ``root`` its source;
    the rest is the base's (an adapter is served wherever its base is)."""
    return [
        {**entry, "id": f"{record.id}:{lora.name}", "parent": record.id, "root": lora.source}
        for lora in lora_adapters(record.served.profile.loadtime)
    ]


def device_entries(records: Iterable[ModelRecord], devices: Sequence[str]) -> list[dict[str, Any]]:
    """Each device and the model claiming it, as ``/v1/devices`` shows them."""
    holder: dict[int, str] = {i: r.id for r in records for i in r.block}
    return [{"device": d, "model": holder.get(i)} for i, d in enumerate(devices)]
