"""``sie_server.adapters.modernbert_flash:ModernBERTFlashAdapter``
(the default engine).

SIE's flash-attention ModernBERT embedder: pooling cls or mean (default cls), normalize,
templates. cuda_graphs and fused_rope tune SIE's kernels and have no effect here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from sie_server.adapters.base import Task
from sie_server.adapters.transformers import SieTransformersAdapter

__all__ = ["ModernBERTFlashAdapter"]


class ModernBERTFlashAdapter(SieTransformersAdapter):
    """SIE's adapter, served by the default engine (encode)."""

    served_task: ClassVar[Task] = "encode"
    sie_options = (
        "normalize",
        "max_seq_length",
        "compute_precision",
        "pooling",
        "query_template",
        "doc_template",
        "trust_remote_code",
        "revision",
        "cuda_graphs",
        "fused_rope",
        "default_instruction",
    )
    engine_options: ClassVar[Mapping[str, str]] = {
        "pooling": "--pooling",
        "normalize": "--no-normalize",
        "query_template": "--query-template",
        "doc_template": "--doc-template",
        "default_instruction": "--default-instruction",
    }
    defaults: ClassVar[Mapping[str, Any]] = {"pooling": "cls"}
