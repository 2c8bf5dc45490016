"""``sie_server.adapters.sglang.embedding:SGLangEmbeddingAdapter``: embeddings."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from sie_server.adapters.base import Task
from sie_server.adapters.sglang import SGLangAdapter

__all__ = ["SGLangEmbeddingAdapter"]


class SGLangEmbeddingAdapter(SGLangAdapter):
    """Embeddings from an SGLang engine started with ``--is-embedding``."""

    served_task: ClassVar[Task] = "encode"

    @classmethod
    def engine_args(cls, loadtime: Mapping[str, Any]) -> tuple[str, ...]:
        return ("--is-embedding",)
