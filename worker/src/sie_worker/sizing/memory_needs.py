"""What a model needs on each of its devices, and the share its engine is told to take. Pure.

Needs (DESIGN "Device memory"), per device of the model's block:

- SGLang adapters: ``f x total + 1 GiB``, ``f`` = ``mem_fraction_static`` (0.85 when
  undeclared, as SIE): SGLang takes ``f`` of the device for weights and KV cache, and the
  CUDA context, graphs and activations come on top.
- vLLM adapters: ``f x total``, ``f`` = ``gpu_memory_utilization`` (0.9 when undeclared,
  vLLM's default): vLLM's share of the device's total holds everything it allocates there.
- The default engine: its load-time ``memory_gib`` when declared; else its weight files'
  bytes x 1.2 + 1 GiB on CUDA (+ 0.5 GiB more on ``cpu``, where the Python process and
  torch's CPU allocator count too).
- Unknown (the device's total or the weights' size unknown): None; such a model shares its
  device with nobody.

Engine share (:func:`engine_share`): SGLang reads ``--mem-fraction-static`` as a fraction
of the memory *free* when it starts, so a model's ``f x total`` becomes ``(f x total) / free``
there, floored to three decimals (never above what was asked of the free memory). vLLM reads
``--gpu-memory-utilization`` as a fraction of the total, so it gets ``f`` itself, and refuses
to start with less than that free; on ``cpu`` devices its KV cache
(``VLLM_CPU_KVCACHE_SPACE``) is its share less its rank's part of the weights, in whole GiB,
at least 1. SGLang on ``cpu`` devices measures the machine's free memory rather than its
device's, so its KV cache is capped in tokens (``--max-total-tokens``): its share
(``mem_fraction_static x total``) less its rank's part of the weights, over a token's KV bytes
on one rank, at least :data:`MIN_CPU_KV_TOKENS`. The default engine on CUDA caps its
allocator at ``need / total``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sie_server.adapters.base import EngineKind
from sie_worker.engines.registry import family_of

__all__ = [
    "CPU_EXTRA_BYTES",
    "DEFAULT_GPU_MEMORY_UTILIZATION",
    "DEFAULT_MEM_FRACTION",
    "ENGINE_OVERHEAD_BYTES",
    "GIB",
    "MIN_CPU_KV_TOKENS",
    "WEIGHTS_FACTOR",
    "EngineKind",
    "EngineShare",
    "NoRoomAtStart",
    "cuda_cap",
    "declared_fraction",
    "engine_share",
    "memory_need",
    "sglang_cpu_kv_tokens",
    "sglang_fraction",
    "vllm_cpu_kv_gib",
    "weights_need",
]

GIB = 2**30
DEFAULT_MEM_FRACTION = 0.85  # SIE's default mem_fraction_static
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default gpu_memory_utilization
ENGINE_OVERHEAD_BYTES = GIB  # CUDA context, graphs, activations beside the engine's share
WEIGHTS_FACTOR = 1.2  # the default engine's weights on a device, with their buffers
CPU_EXTRA_BYTES = GIB // 2
MIN_CPU_KV_TOKENS = 1024  # a KV cache smaller than this serves no useful batch


class NoRoomAtStart(Exception):
    """Less memory is free on the device than the engine's share needs."""

    def __init__(self, wanted: int, free: int) -> None:
        super().__init__(f"needs {_gib(wanted)} free but {_gib(free)} is")
        self.wanted, self.free = wanted, free


def memory_need(
    engine: EngineKind,
    total: int | None,
    *,
    on_cpu: bool = False,
    mem_fraction: float | None = None,
    memory_gib: float | None = None,
    weights_bytes: int | None = None,
) -> int | None:
    """Bytes the model reserves on each of its devices; None when unknown. ``mem_fraction``:
    the engine's declared share (its :attr:`~sie_worker.engines.family.EngineFamily.memory_option`);
    ``memory_gib`` and ``weights_bytes`` what the weight-sized engines reserve."""
    family = family_of(engine)
    declared: dict[str, Any] = {}
    if mem_fraction is not None and family.memory_option is not None:
        declared[family.memory_option] = mem_fraction
    if memory_gib is not None:
        declared["memory_gib"] = memory_gib
    return family.memory_need(total, on_cpu=on_cpu, declared=declared, weights_bytes=weights_bytes)


def weights_need(
    declared: Mapping[str, Any], weights_bytes: int | None, *, on_cpu: bool
) -> int | None:
    """What an engine sized by its weights reserves (the default engine, llama.cpp): the
    declared ``memory_gib``, else its weights x :data:`WEIGHTS_FACTOR` + the engine's overhead
    (+ :data:`CPU_EXTRA_BYTES` on cpu); None when neither is known."""
    memory_gib = declared_fraction(declared, "memory_gib")
    if memory_gib is not None:
        return math.ceil(memory_gib * GIB)
    if weights_bytes is None:
        return None
    extra = CPU_EXTRA_BYTES if on_cpu else 0
    return math.ceil(weights_bytes * WEIGHTS_FACTOR) + ENGINE_OVERHEAD_BYTES + extra


def sglang_fraction(total: int, free: int, mem_fraction: float | None) -> float:
    """``--mem-fraction-static`` for an engine starting with ``free`` bytes free on a device
    of ``total``: ``(f x total) / free``, floored to 3 decimals. Raises
    :class:`NoRoomAtStart` when the free memory cannot hold ``f x total``."""
    fraction = DEFAULT_MEM_FRACTION if mem_fraction is None else mem_fraction
    wanted = fraction * total
    if free <= 0 or wanted > free:
        raise NoRoomAtStart(math.ceil(wanted), max(free, 0))
    return math.floor(wanted / free * 1000) / 1000


def vllm_cpu_kv_gib(total: int, fraction: float, weights_bytes: int | None, width: int) -> int:
    """``VLLM_CPU_KVCACHE_SPACE`` of a vLLM rank on a cpu device of ``total`` bytes: its share
    (``fraction x total``) less its part of the weights, in whole GiB, at least 1."""
    rank_weights = (weights_bytes or 0) / max(width, 1)
    return max(1, math.floor((fraction * total - rank_weights) / GIB))


def sglang_cpu_kv_tokens(
    total: int, fraction: float, weights_bytes: int | None, width: int, token_bytes: float
) -> int:
    """``--max-total-tokens`` of an SGLang rank on a cpu device of ``total`` bytes: its share
    (``fraction x total``) less its part of the weights, over one token's KV bytes on a rank,
    at least :data:`MIN_CPU_KV_TOKENS`."""
    rank_weights = (weights_bytes or 0) / max(width, 1)
    room = fraction * total - rank_weights
    return max(MIN_CPU_KV_TOKENS, math.floor(room / token_bytes)) if token_bytes > 0 else 0


@dataclass(frozen=True)
class EngineShare:
    """What an engine is told of its memory: ``fraction`` is its memory flag (SGLang's
    ``--mem-fraction-static``, vLLM's ``--gpu-memory-utilization``, the default engine's
    ``--cuda-memory-fraction``; None: none passed), ``kv_cache_gib`` vLLM's KV cache on cpu
    devices (``VLLM_CPU_KVCACHE_SPACE``), ``kv_tokens`` SGLang's on cpu devices
    (``--max-total-tokens``)."""

    fraction: float | None
    kv_cache_gib: int | None = None
    kv_tokens: int | None = None


def engine_share(
    engine: EngineKind,
    *,
    on_cuda: bool,
    need: int,
    totals: Sequence[int],
    frees: Sequence[int],
    declared: Mapping[str, Any],
    weights_bytes: int | None = None,
    kv_token_bytes: float | None = None,
) -> EngineShare:
    """The share of an engine starting on a block whose devices have ``totals`` bytes, of which
    ``frees`` are free now (the model reserves ``need`` on each); ``weights_bytes`` and
    ``kv_token_bytes`` (one token's KV bytes on one rank) size a KV cache on cpu devices.
    Raises :class:`NoRoomAtStart` when a device has less free than the engine will take."""
    return family_of(engine).share(
        on_cuda=on_cuda,
        need=need,
        totals=totals,
        frees=frees,
        declared=declared,
        weights_bytes=weights_bytes,
        kv_token_bytes=kv_token_bytes,
    )


def declared_fraction(declared: Mapping[str, Any], key: str) -> float | None:
    value = declared.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def cuda_cap(need: int, total: int) -> float:
    """The default engine's ``torch.cuda.set_per_process_memory_fraction``: its need as a
    share of the device, floored to 3 decimals, at most 1."""
    return min(math.floor(need / total * 1000) / 1000, 1.0)


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"
