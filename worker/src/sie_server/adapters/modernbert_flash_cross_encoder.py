"""``sie_server.adapters.modernbert_flash_cross_encoder:ModernBertFlashCrossEncoderAdapter``
(the default engine).

SIE's flash-attention ModernBERT cross-encoder (a sigmoid when the model has one label).
cuda_graphs tunes SIE's kernels and has no effect here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from sie_server.adapters.base import Task
from sie_server.adapters.transformers import SieTransformersAdapter

__all__ = ["ModernBertFlashCrossEncoderAdapter"]


class ModernBertFlashCrossEncoderAdapter(SieTransformersAdapter):
    """SIE's adapter, served by the default engine (score)."""

    served_task: ClassVar[Task] = "score"
    sie_options = (
        "trust_remote_code",
        "max_seq_length",
        "compute_precision",
        "revision",
        "cuda_graphs",
    )
    engine_options: ClassVar[Mapping[str, str]] = {}
    defaults: ClassVar[Mapping[str, Any]] = {}
