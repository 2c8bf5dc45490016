"""``sie_server.adapters.bert_flash:BertFlashAdapter``
(the default engine).

SIE's flash-attention BERT embedder: pooling cls or mean (default mean), normalize (default
true), query and document templates, the default instruction for queries. The flash kernels
are SIE's speed-up of the same forward pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from sie_server.adapters.base import Task
from sie_server.adapters.transformers import SieTransformersAdapter

__all__ = ["BertFlashAdapter"]


class BertFlashAdapter(SieTransformersAdapter):
    """SIE's adapter, served by the default engine (encode)."""

    served_task: ClassVar[Task] = "encode"
    sie_options = (
        "normalize",
        "max_seq_length",
        "compute_precision",
        "pooling",
        "query_template",
        "doc_template",
        "revision",
        "default_instruction",
    )
    engine_options: ClassVar[Mapping[str, str]] = {
        "pooling": "--pooling",
        "normalize": "--no-normalize",
        "query_template": "--query-template",
        "doc_template": "--doc-template",
        "default_instruction": "--default-instruction",
    }
    defaults: ClassVar[Mapping[str, Any]] = {"pooling": "mean"}
