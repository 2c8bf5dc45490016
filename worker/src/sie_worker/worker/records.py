"""What the worker knows about each served model, the leases requests hold on its engine,
and the API's view of a model.

:class:`ModelRecord` is one served model's state (claims, memory, engine, pin, errors); only
:class:`~sie_worker.worker.lifecycle.Lifecycle` moves its ``state``. A :class:`Lease` is one
request's hold on a ready engine: it counts the request in flight while it lasts and, when
released (once), records its status and duration. :func:`model_entry` renders a record for
``/v1/models``; ``/v1/devices`` comes from the same claims
(:func:`~sie_worker.worker.placement.claims.device_entries`), so the two views always agree.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from sie_worker.config.load_options import declared_width
from sie_worker.config.lora import BASE_ADAPTER, lora_adapters
from sie_worker.config.model import ServedModel
from sie_worker.model_states import ModelState
from sie_worker.worker.launcher.start import RunningEngine
from sie_worker.worker.metrics import StreamTimer, WorkerMetrics
from sie_worker.worker.weights.progress import Progress

if TYPE_CHECKING:
    import asyncio

__all__ = [
    "Lease",
    "LoadPhase",
    "ModelRecord",
    "Move",
    "adapter_entries",
    "model_entry",
    "open_lease",
]

# Where a loading model is: fetching its weights (no devices claimed yet), or starting its
# engine on its claimed block.
LoadPhase = Literal["downloading", "starting"]


@dataclass(frozen=True)
class Move:
    """One step of a record's lifecycle (:mod:`sie_worker.worker.lifecycle`), kept as the
    record's :attr:`ModelRecord.last_move`."""

    before: ModelState
    after: ModelState
    reason: str
    at: float  # monotonic


@dataclass
class ModelRecord:
    served: ServedModel
    state: ModelState = "unloaded"
    block: tuple[int, ...] = ()
    memory: int | None = None  # bytes reserved on each device of the block (None: unknown)
    placed_at: float = 0.0  # monotonic: when the block was claimed (orders a device's models)
    # What the model would reserve before it loads, for the config it was computed from.
    need_estimate: tuple[ServedModel, int | None] | None = None
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
    last_move: Move | None = None  # the last step of its lifecycle, with its reason

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


def model_entry(
    record: ModelRecord, devices: Sequence[str], *, memory_bytes: int | None = None
) -> dict[str, Any]:
    """The record as ``/v1/models`` shows it; ``phase`` and the byte counts are set only
    while the model loads (the bytes only when its weights are fetched). ``memory_bytes``
    is what it reserves on each device (while it holds devices), else what it would."""
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
        "memory_bytes": record.memory if record.block else memory_bytes,
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
