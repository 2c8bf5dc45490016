"""``sie_server.adapters.sglang.gemma:SGLangGemmaAdapter``: Gemma 4 generation.

SIE's routing seam to its ``sglang-cu130`` bundle: the generation adapter on the newer engine
(SGLang 0.5.20 in SIE, 0.5.23 here), whose ``gemma4`` reasoning and tool parsers and
renamed flags (``--disable-prefill-cuda-graph``, ``--mamba-radix-cache-strategy``) it needs.
The prefill CUDA graph is off at every width by default, as on every ``sglang-cu130`` model.
"""

from __future__ import annotations

from typing import ClassVar

from sie_server.adapters.sglang.generation import SGLangGenerationAdapter

__all__ = ["SGLangGemmaAdapter"]


class SGLangGemmaAdapter(SGLangGenerationAdapter):
    """Generation on the ``sglang-cu130`` bundle's engine."""

    bundle: ClassVar[str] = "sglang-cu130"
    min_sglang: ClassVar[str | None] = "0.5.20"
