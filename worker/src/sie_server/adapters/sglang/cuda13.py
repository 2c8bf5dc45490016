"""``sie_server.adapters.sglang.cuda13``: generation on the CUDA 13 engine.

``SGLangCuda13Adapter`` is SIE's routing seam to its ``sglang-cu130`` bundle for profiles
that need the newer engine (SGLang 0.5.20 in SIE, 0.5.23 here): the generation adapter with
that release's flag spellings. ``SGLangStrictThinkingAdapter`` adds
``--enable-strict-thinking`` (SGLang: "Enable strict token filtering during the thinking
phase. Blocks model-specific excluded tokens (e.g., tool call markers) during reasoning.
Requires a grammar backend that supports token filtering."), unless ``extra_launch_args``
already has it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from sie_server.adapters.sglang.generation import SGLangGenerationAdapter

__all__ = ["SGLangCuda13Adapter", "SGLangStrictThinkingAdapter"]

STRICT_THINKING = "--enable-strict-thinking"


class SGLangCuda13Adapter(SGLangGenerationAdapter):
    """Generation on the ``sglang-cu130`` bundle's engine."""

    bundle: ClassVar[str] = "sglang-cu130"
    min_sglang: ClassVar[str | None] = "0.5.20"


class SGLangStrictThinkingAdapter(SGLangCuda13Adapter):
    """The cu130 adapter with strict token filtering while the model thinks."""

    added_flags = (STRICT_THINKING,)

    @classmethod
    def engine_args(
        cls, loadtime: Mapping[str, Any], runtime: Mapping[str, Any] | None = None
    ) -> tuple[str, ...]:
        extra = loadtime.get("extra_launch_args") or ()
        return () if STRICT_THINKING in extra else (STRICT_THINKING,)
