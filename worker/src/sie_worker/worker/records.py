"""What the worker knows about each served model, and the API's views of it.

:class:`ModelRecord` is one served model's state (claims, engine, pin, errors); the
:class:`~sie_worker.worker.manager.ModelManager` changes records, :func:`model_entry` and
:func:`device_entries` render them for ``/v1/models`` and ``/v1/devices`` from the same
claims, so the two views always agree.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sie_worker.config.loadtime import LoadOptions, declared_width
from sie_worker.config.model import ServedModel
from sie_worker.worker.engine_process import EngineProcess

__all__ = ["ModelRecord", "RunningEngine", "device_entries", "model_entry"]


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


@dataclass
class ModelRecord:
    served: ServedModel
    state: str = "unloaded"
    block: tuple[int, ...] = ()
    pinned: bool = False
    error: str | None = None
    last_used: float = 0.0  # monotonic, for placement
    last_used_wall: float | None = None
    running: RunningEngine | None = None
    load_task: asyncio.Task[None] | None = None
    config_pending: bool = False
    pinned_retry_at: float = 0.0
    pinned_backoff_s: float = 1.0

    @property
    def id(self) -> str:
        return self.served.id


def model_entry(record: ModelRecord, devices: Sequence[str]) -> dict[str, Any]:
    """The record as ``/v1/models`` shows it."""
    running = record.running
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
    }


def device_entries(records: Iterable[ModelRecord], devices: Sequence[str]) -> list[dict[str, Any]]:
    """Each device and the model claiming it, as ``/v1/devices`` shows them."""
    holder: dict[int, str] = {i: r.id for r in records for i in r.block}
    return [{"device": d, "model": holder.get(i)} for i, d in enumerate(devices)]
