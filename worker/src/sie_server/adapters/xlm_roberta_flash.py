"""``sie_server.adapters.xlm_roberta_flash:XLMRobertaFlashAdapter``
(the default engine).

SIE's flash-attention XLM-RoBERTa embedder: pooling cls or mean (default mean), normalize,
templates, the default instruction (SIE also reads a runtime instruction as one).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from sie_server.adapters.base import Task
from sie_server.adapters.transformers import SieTransformersAdapter

__all__ = ["XLMRobertaFlashAdapter"]


class XLMRobertaFlashAdapter(SieTransformersAdapter):
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
        "instruction",
    )
    engine_options: ClassVar[Mapping[str, str]] = {
        "pooling": "--pooling",
        "normalize": "--no-normalize",
        "query_template": "--query-template",
        "doc_template": "--doc-template",
        "default_instruction": "--default-instruction",
        "instruction": "--default-instruction",
    }
    defaults: ClassVar[Mapping[str, Any]] = {"pooling": "mean"}
