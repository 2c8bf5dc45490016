"""The allocator over the worker's records: claims read from the records, budgets from device
memory, the model's need, a short backoff after a refusal, and the device views.

``/v1/devices`` and ``/v1/models`` are rendered from the same records (a record's ``block``
and ``memory``), so the two views always agree.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sie_server.adapters.base import EngineKind
from sie_worker.config.adapters import NotServedHere, UnknownAdapter, resolve_adapter
from sie_worker.config.load.load_options import LoadOptions, adapter_of
from sie_worker.config.load.model_shape import ModelPathError, local_model_dir
from sie_worker.config.model import ServedModel
from sie_worker.engines.registry import family_of
from sie_worker.errors import PlacementFailed
from sie_worker.settings import Settings
from sie_worker.sizing.arithmetic import kv_bytes_per_token_per_gpu
from sie_worker.sizing.capacity import kv_bytes_per_value
from sie_worker.sizing.memory_needs import EngineShare
from sie_worker.sizing.model_stats import ModelStatsError, shape_from_config
from sie_worker.worker.metrics import WorkerMetrics
from sie_worker.worker.placement.allocator import Claim, NoPlacement, Placement, Strategy, place
from sie_worker.worker.placement.memory import DeviceMemory
from sie_worker.worker.records import ModelRecord
from sie_worker.worker.weights.on_disk import weight_bytes

__all__ = ["Placer", "claims_of", "cpu_kv_inputs", "estimated_need", "need_of", "share_at_start"]

_BACKOFF_S = 0.5


def need_of(options: LoadOptions, memory: DeviceMemory, *, on_cpu: bool) -> int | None:
    """Bytes the model of ``options`` reserves on each of its devices (None: unknown).

    Reads the local weights' sizes for the default engine: call it off the event loop.
    """
    folder = Path(options.model_path) if options.model_path is not None else None
    engine = resolve_adapter(options.adapter).engine
    return _need(engine, options.declared, folder, memory, on_cpu=on_cpu)


def cpu_kv_inputs(
    served: ServedModel, options: LoadOptions, *, on_cuda: bool
) -> tuple[int | None, float | None]:
    """What sizes an engine's KV cache on cpu devices
    (:func:`~sie_worker.sizing.memory_needs.engine_share`): its local weights' bytes (vLLM,
    SGLang) and one token's KV bytes on one rank (SGLang: from config.json's shape, its
    tensor width and stages, and the cached value's size); None where unknown or not needed.

    Reads files: call it off the event loop."""
    sizing = family_of(resolve_adapter(options.adapter).engine).cpu_kv_sizing()
    if on_cuda or sizing == "none" or options.model_path is None:
        return None, None
    folder = Path(options.model_path)
    weights = weight_bytes(folder)
    if sizing != "tokens":
        return weights, None
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        shape = shape_from_config(config, where=str(folder / "config.json"))
    except (OSError, ValueError, ModelStatsError):
        return weights, None
    per_value, _ = kv_bytes_per_value(served)
    token_bytes = kv_bytes_per_token_per_gpu(
        shape, options.tensor_width, per_value, pipeline=options.stages
    )
    return weights, token_bytes


def share_at_start(
    served: ServedModel,
    options: LoadOptions,
    *,
    on_cuda: bool,
    need: int | None,
    totals: Sequence[int | None],
    frees: Sequence[int] | None = None,
) -> EngineShare | None:
    """What the engine of a load is told of its memory when it starts on devices of
    ``totals`` bytes with ``frees`` free (None: all of them, an empty worker), for the worker
    and ``sie-worker plan`` alike; None when the need or a device's total is unknown. Raises
    :class:`~sie_worker.sizing.memory_needs.NoRoomAtStart` when a device has too little.

    Reads files on cpu devices: call it off the event loop."""
    known = [t for t in totals if t is not None]
    if need is None or len(known) != len(totals):
        return None
    weights, token_bytes = cpu_kv_inputs(served, options, on_cuda=on_cuda)
    return family_of(resolve_adapter(options.adapter).engine).share(
        on_cuda=on_cuda,
        need=need,
        totals=known,
        frees=list(frees) if frees is not None else known,
        declared=options.declared,
        weights_bytes=weights,
        kv_token_bytes=token_bytes,
    )


def estimated_need(served: ServedModel, settings: Settings, memory: DeviceMemory) -> int | None:
    """What a model not loaded yet would reserve, from its profile alone (its weights' sizes
    when they are in a local ``model_path``); None where that is not known before a load."""
    try:
        engine = adapter_of(served, settings).engine
        folder = local_model_dir(served.config)
    except (UnknownAdapter, NotServedHere, ModelPathError):
        return None
    on_cpu = not settings.devices[0].startswith("cuda")
    return _need(engine, served.profile.loadtime, folder, memory, on_cpu=on_cpu)


def _need(
    engine: EngineKind,
    loadtime: Mapping[str, Any],
    folder: Path | None,
    memory: DeviceMemory,
    *,
    on_cpu: bool,
) -> int | None:
    # With devices of different totals the largest one counts (a conservative need).
    totals = [t for t in memory.totals if t is not None]
    if not totals:
        return None
    family = family_of(engine)
    weights = None
    if family.needs_weights(on_cpu=on_cpu) and "memory_gib" not in loadtime and folder is not None:
        weights = family.weight_bytes(folder, loadtime)
    return family.memory_need(max(totals), on_cpu=on_cpu, declared=loadtime, weights_bytes=weights)


class Placer:
    """Where the next model goes, given every record's claim. Call under the manager's lock."""

    def __init__(
        self,
        devices: Sequence[str],
        memory: DeviceMemory,
        strategy: Strategy,
        metrics: WorkerMetrics,
    ) -> None:
        self.devices = tuple(devices)
        self.memory = memory
        self.strategy: Strategy = strategy
        self._metrics = metrics
        self._budgets = memory.budgets()
        self._backoff: dict[tuple[int, int | None], float] = {}

    def place(
        self, record: ModelRecord, records: Iterable[ModelRecord], width: int, need: int | None
    ) -> Placement:
        """Where ``record`` would go now (devices, evictions). Raises :class:`PlacementFailed`
        when no room can be made; another try for the same size waits a moment."""
        now = time.monotonic()
        key = (width, need)
        if self._backoff.get(key, 0.0) > now:
            raise PlacementFailed(
                f"{record.id}: no room for it could be made a moment ago; retry shortly",
                retry_after_s=1,
            )
        try:
            return place(
                self._budgets, claims_of(records), width, need=need, strategy=self.strategy
            )
        except NoPlacement as exc:
            self._backoff[key] = now + _BACKOFF_S
            self._metrics.placement_failures.inc()
            raise PlacementFailed(f"{record.id}: " + exc.describe(self.devices)) from None

    def forget_refusals(self) -> None:
        """Room may have been made (a model unloaded or unpinned): the next try is real."""
        self._backoff.clear()

    def reserved(
        self, index: int, records: Iterable[ModelRecord], *, other_than: ModelRecord
    ) -> int:
        """Bytes the models on device ``index`` other than ``other_than`` reserve."""
        return sum(r.memory or 0 for r in records if r is not other_than and index in r.block)

    def device_entries(self, records: Iterable[ModelRecord]) -> list[dict[str, Any]]:
        """``/v1/devices``: each device, the models on it in the order they were placed
        (``model``: the first, as before devices were shared), its total, budget and what
        the models there reserve."""
        on: list[list[ModelRecord]] = [[] for _ in self.devices]
        for record in records:
            for index in record.block:
                on[index].append(record)
        entries = []
        for index, device in enumerate(self.devices):
            holders = sorted(on[index], key=lambda r: (r.placed_at, r.id))
            known = self.memory.totals[index] is not None
            entries.append(
                {
                    "device": device,
                    "model": holders[0].id if holders else None,
                    "models": [r.id for r in holders],
                    "memory_total_bytes": self.memory.totals[index],
                    "memory_budget_bytes": self._budgets[index],
                    "memory_reserved_bytes": (
                        sum(r.memory or 0 for r in holders) if known else None
                    ),
                }
            )
        return entries


def claims_of(records: Iterable[ModelRecord]) -> list[Claim]:
    """The allocator's view of every record holding devices."""
    return [
        Claim(
            r.id,
            r.block[0],
            len(r.block),
            pinned=r.pinned,
            last_used=r.last_used,
            evictable=r.state == "ready",
            memory=r.memory,
        )
        for r in records
        if r.block
    ]
