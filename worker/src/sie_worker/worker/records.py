"""What the worker knows about each served model, and the API's view of a model.

:class:`ModelRecord` is one served model's state (claims, memory, engine, pin, errors, and
what requests read of its config); only :class:`~sie_worker.worker.lifecycle.Lifecycle`
moves its ``state``. The leases requests hold on its engine are
:mod:`sie_worker.worker.proxy`'s. :func:`model_entry` renders a record for
``/v1/models``; ``/v1/devices`` comes from the same claims
(:func:`~sie_worker.worker.placement.claims.device_entries`), so the two views always agree.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from sie_worker.config.load.load_options import declared_width
from sie_worker.config.lora import lora_adapters
from sie_worker.config.model import ServedModel
from sie_worker.model_states import ModelState
from sie_worker.worker.launcher.start import RunningEngine
from sie_worker.worker.serving import ServingFacts, serving_facts
from sie_worker.worker.weights.progress import Progress

if TYPE_CHECKING:
    import asyncio

__all__ = [
    "LoadPhase",
    "ModelRecord",
    "Move",
    "adapter_entries",
    "model_entry",
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

    # What requests read of the config, worked out once (:mod:`sie_worker.worker.serving`).
    facts: ServingFacts = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.facts = serving_facts(self.served)

    @property
    def id(self) -> str:
        return self.served.id

    def serve(self, served: ServedModel) -> None:
        """Serve ``served`` from now on (a config that changed)."""
        self.served, self.facts = served, serving_facts(served)

    def touch(self) -> None:
        self.last_used = time.monotonic()
        self.last_used_wall = time.time()


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
