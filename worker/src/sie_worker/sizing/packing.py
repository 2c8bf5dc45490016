"""Which single-GPU models fit together on one GPU, and the shares the worker gives them. Pure.

Each model needs its weights plus the KV cache of its workload (seed 004's arithmetic,
:mod:`sie_worker.sizing.plan`). On a worker, an SGLang model reserves
``mem_fraction_static x GPU memory + 1 GiB`` and a vLLM model
``gpu_memory_utilization x GPU memory`` (:mod:`sie_worker.sizing.memory_needs`); the
fraction to declare is its need over the GPU's memory, rounded up to a hundredth, unless the
config declares one. The default engine reserves its weights x 1.2 + 1 GiB.

Models are packed first-fit by decreasing reservation into GPUs whose budget is the memory x
the worker's pressure threshold (``SIE_MEMORY_PRESSURE_THRESHOLD_PERCENT``, 95); a model
alone on a GPU always fits. In that load order the worker passes each SGLang engine
``(f x memory) / free memory at its start`` and each vLLM engine its ``f`` unchanged (a share
of the total); the default engine caps its CUDA allocator at its reservation's share.
Models wider than one GPU claim their GPUs whole and share none.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from sie_server.adapters.base import EngineKind
from sie_worker.engines.registry import family_of

__all__ = ["Packing", "Seat", "Tenant", "pack", "seat_for", "suggest_fraction"]


@dataclass(frozen=True)
class Tenant:
    """One model to place: what it needs to serve its workload, and what its config says."""

    name: str
    engine: EngineKind
    width: int | None  # the width it needs (None: no width holds it)
    need_bytes: float  # weights + KV cache of its workload
    weights_bytes: float
    # mem_fraction_static (SGLang) or gpu_memory_utilization (vLLM) as declared
    declared_fraction: float | None = None
    declared_memory_gib: float | None = None  # the default engine's memory_gib


@dataclass(frozen=True)
class Seat:
    """A model on a GPU: the reservation the worker makes for it and the share it passes."""

    name: str
    fraction: float | None  # SGLang's mem_fraction_static, vLLM's gpu_memory_utilization
    engine: EngineKind
    suggested: bool  # the fraction is this tool's suggestion (the config declares none)
    reserved_bytes: int
    share: float | None = None  # what its engine is told at start, in the load order
    short_bytes: float = 0.0  # a declared fraction below the model's need by this much


@dataclass(frozen=True)
class Packing:
    gpu_memory_bytes: int
    budget_bytes: int
    gpus: tuple[tuple[Seat, ...], ...]
    groups: tuple[tuple[str, int], ...]  # (model, width) of models that claim whole GPUs
    unplaceable: tuple[str, ...]  # models no width holds

    @property
    def gpus_shared(self) -> int:
        return len(self.gpus) + sum(width for _, width in self.groups)

    @property
    def gpus_exclusive(self) -> int:
        """GPUs the same models need when every model claims its own."""
        singles = sum(len(gpu) for gpu in self.gpus)
        return singles + sum(width for _, width in self.groups)


def suggest_fraction(need_bytes: float, gpu_memory_bytes: int) -> float:
    """The fraction (``mem_fraction_static``, ``gpu_memory_utilization``) that holds
    ``need_bytes``: need / memory, up to a hundredth."""
    return min(math.ceil(need_bytes / gpu_memory_bytes * 100 - 1e-9) / 100, 0.99)


def seat_for(tenant: Tenant, gpu_memory_bytes: int) -> Seat:
    """The worker's reservation for ``tenant`` on one GPU (its share not yet known): an
    engine with a declared share (SGLang's, vLLM's) reserves what that share asks, or the
    share that holds its need; one sized by its weights (the default engine) reserves those."""
    family = family_of(tenant.engine)
    if family.memory_option is not None:
        suggested = tenant.declared_fraction is None
        fraction = (
            suggest_fraction(tenant.need_bytes, gpu_memory_bytes)
            if tenant.declared_fraction is None
            else tenant.declared_fraction
        )
        reserved = family.memory_need(
            gpu_memory_bytes,
            on_cpu=False,
            declared={family.memory_option: fraction},
            weights_bytes=None,
        )
        short = max(tenant.need_bytes - fraction * gpu_memory_bytes, 0.0)
        assert reserved is not None
        return Seat(tenant.name, fraction, tenant.engine, suggested, reserved, short_bytes=short)
    declared = (
        {} if tenant.declared_memory_gib is None else {"memory_gib": tenant.declared_memory_gib}
    )
    reserved = family.memory_need(
        gpu_memory_bytes,
        on_cpu=False,
        declared=declared,
        weights_bytes=math.ceil(tenant.weights_bytes),
    )
    assert reserved is not None
    return Seat(tenant.name, None, tenant.engine, False, reserved)


def pack(
    tenants: Sequence[Tenant], gpu_memory_bytes: int, threshold_percent: float = 95.0
) -> Packing:
    """Fit the single-GPU ``tenants`` onto as few GPUs of ``gpu_memory_bytes`` as first-fit
    decreasing finds, with the shares the worker passes in that load order."""
    budget = math.floor(gpu_memory_bytes * threshold_percent / 100)
    singles = [t for t in tenants if t.width == 1]
    seats = sorted(
        (seat_for(t, gpu_memory_bytes) for t in singles),
        key=lambda s: (-s.reserved_bytes, s.name),
    )
    bins: list[list[Seat]] = []
    for seat in seats:
        for gpu in bins:
            if sum(s.reserved_bytes for s in gpu) + seat.reserved_bytes <= budget:
                gpu.append(seat)
                break
        else:
            bins.append([seat])
    gpus = tuple(tuple(_with_shares(gpu, gpu_memory_bytes)) for gpu in bins)
    groups = tuple((t.name, t.width) for t in tenants if t.width is not None and t.width > 1)
    unplaceable = tuple(t.name for t in tenants if t.width is None)
    return Packing(gpu_memory_bytes, budget, gpus, groups, unplaceable)


def _with_shares(gpu: list[Seat], total: int) -> list[Seat]:
    placed: list[Seat] = []
    reserved = 0
    for seat in gpu:
        family = family_of(seat.engine)
        share = family.packed_share(total, total - reserved, seat.fraction, seat.reserved_bytes)
        placed.append(replace(seat, share=share))
        reserved += seat.reserved_bytes
    return placed
