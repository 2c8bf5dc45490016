"""What a model needs on each of its devices, and the share its engine is told to take. Pure.

Needs (DESIGN "Device memory"), per device of the model's block:

- SGLang adapters: ``f x total + 1 GiB``, ``f`` = ``mem_fraction_static`` (0.85 when
  undeclared, as SIE): SGLang takes ``f`` of the device for weights and KV cache, and the
  CUDA context, graphs and activations come on top.
- The default engine: its load-time ``memory_gib`` when declared; else its weight files'
  bytes x 1.2 + 1 GiB on CUDA (+ 0.5 GiB more on ``cpu``, where the Python process and
  torch's CPU allocator count too).
- Unknown (the device's total or the weights' size unknown): None; such a model shares its
  device with nobody.

Engine share: SGLang reads ``--mem-fraction-static`` as a fraction of the memory *free*
when it starts, so a model's ``f x total`` becomes ``(f x total) / free`` there, floored to
three decimals (never above what was asked of the free memory). The default engine on CUDA
caps its allocator at ``need / total``.
"""

from __future__ import annotations

import math
from typing import Literal

__all__ = [
    "CPU_EXTRA_BYTES",
    "DEFAULT_MEM_FRACTION",
    "ENGINE_OVERHEAD_BYTES",
    "GIB",
    "WEIGHTS_FACTOR",
    "EngineKind",
    "NoRoomAtStart",
    "cuda_cap",
    "memory_need",
    "sglang_fraction",
]

GIB = 2**30
DEFAULT_MEM_FRACTION = 0.85  # SIE's default mem_fraction_static
ENGINE_OVERHEAD_BYTES = GIB  # CUDA context, graphs, activations beside the engine's share
WEIGHTS_FACTOR = 1.2  # the default engine's weights on a device, with their buffers
CPU_EXTRA_BYTES = GIB // 2
EngineKind = Literal["sglang", "transformers"]


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
    """Bytes the model reserves on each of its devices; None when unknown."""
    if engine == "sglang":
        if total is None:
            return None
        fraction = DEFAULT_MEM_FRACTION if mem_fraction is None else mem_fraction
        return math.ceil(fraction * total) + ENGINE_OVERHEAD_BYTES
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


def cuda_cap(need: int, total: int) -> float:
    """The default engine's ``torch.cuda.set_per_process_memory_fraction``: its need as a
    share of the device, floored to 3 decimals, at most 1."""
    return min(math.floor(need / total * 1000) / 1000, 1.0)


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"
