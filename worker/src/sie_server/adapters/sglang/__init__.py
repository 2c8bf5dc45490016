"""SGLang adapters: one SGLang engine per model, tensor parallel across its GPU block.

Their load-time options, and the SGLang flag each one means, are one table:
:mod:`sie_worker.engines.sglang.flags`.
"""

from __future__ import annotations

from typing import ClassVar

from sie_server.adapters.base import EngineKind, OneTaskAdapter
from sie_worker.engines.sglang.flags import Family, options_for

__all__ = ["SEED_OPTIONS", "SGLANG_LOADTIME_OPTIONS", "SGLangAdapter"]

# What every SGLang adapter accepts in adapter_options.loadtime; adapters built on these
# may add more.
SGLANG_LOADTIME_OPTIONS: tuple[str, ...] = (
    "tensor_parallel_size",
    "request_read_timeout_s",
    "startup_timeout_s",
    "watchdog_timeout_s",
    "disable_piecewise_cuda_graph",
    "nccl_port",
    "disable_cuda_graph",
)
SEED_OPTIONS = SGLANG_LOADTIME_OPTIONS


class SGLangAdapter(OneTaskAdapter):
    """Common base of the SGLang adapters (not itself an adapter_path)."""

    engine: ClassVar[EngineKind] = "sglang"
    bundle: ClassVar[str] = "sglang"
    family: ClassVar[Family] = "generation"
    loadtime_options = options_for("generation")
