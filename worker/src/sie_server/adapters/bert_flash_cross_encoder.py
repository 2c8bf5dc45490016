"""``sie_server.adapters.bert_flash_cross_encoder:BertFlashCrossEncoderAdapter``
(the default engine).

SIE's flash-attention BERT cross-encoder: one relevance logit per (query, item) pair,
through a sigmoid when the model has one label, as sentence-transformers' CrossEncoder
scores it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from sie_server.adapters.base import Task
from sie_server.adapters.transformers import SieTransformersAdapter

__all__ = ["BertFlashCrossEncoderAdapter"]


class BertFlashCrossEncoderAdapter(SieTransformersAdapter):
    """SIE's adapter, served by the default engine (score)."""

    served_task: ClassVar[Task] = "score"
    sie_options = ("trust_remote_code", "max_seq_length", "compute_precision", "revision")
    engine_options: ClassVar[Mapping[str, str]] = {}
    defaults: ClassVar[Mapping[str, Any]] = {}
