"""llama.cpp adapters: one llama-server per model, serving a GGUF file, its layers split
across its device block (or, in a group of nodes, across the followers' RPC servers).

Their load-time options, and the llama-server flag each one means, are one table:
:mod:`sie_worker.engines.llamacpp.options`. SIE 0.10.1 defines no llama.cpp adapter; this
lives in its adapter namespace as this project's own (as the vLLM adapters do), served by the
``llamacpp`` bundle.
"""

from __future__ import annotations

from typing import ClassVar

from sie_server.adapters.base import EngineKind, OneTaskAdapter
from sie_worker.engines.llamacpp.options import LLAMACPP_OPTIONS

__all__ = ["LlamaCppAdapter"]


class LlamaCppAdapter(OneTaskAdapter):
    """Common base of the llama.cpp adapters (not itself an adapter_path)."""

    engine: ClassVar[EngineKind] = "llamacpp"
    bundle: ClassVar[str] = "llamacpp"
    loadtime_options = tuple(LLAMACPP_OPTIONS)
