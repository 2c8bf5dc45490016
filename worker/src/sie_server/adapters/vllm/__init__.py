"""vLLM adapters: one vLLM engine per model, tensor parallel across its device block.

Their load-time options, and the vLLM flag each one means, are one table:
:mod:`sie_worker.engines.vllm.flags`. SIE 0.10.1 defines no vLLM adapter; these live in its
adapter namespace as this project's own (as the SGLang chat adapter does), served by the
``vllm`` bundle.
"""

from __future__ import annotations

from typing import ClassVar

from sie_server.adapters.base import EngineKind, OneTaskAdapter
from sie_worker.engines.vllm.flags import Family, options_for

__all__ = ["VLLMAdapter"]


class VLLMAdapter(OneTaskAdapter):
    """Common base of the vLLM adapters (not itself an adapter_path)."""

    engine: ClassVar[EngineKind] = "vllm"
    bundle: ClassVar[str] = "vllm"
    family: ClassVar[Family] = "generation"
    loadtime_options = options_for("generation")
