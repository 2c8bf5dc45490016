"""``sie_server.adapters.sglang.embedding:SGLangEmbeddingAdapter``: embeddings.

SIE serves it with its ``sglang-embedding`` bundle (SGLang 0.5.10.post1, as its ``sglang``
bundle); this image with the ``sglang`` bundle."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from sie_server.adapters.base import Task
from sie_server.adapters.sglang import SGLangAdapter
from sie_worker.engines.sglang.flags import Family, options_for

__all__ = ["SGLangEmbeddingAdapter"]


class SGLangEmbeddingAdapter(SGLangAdapter):
    """Embeddings from an SGLang engine started with ``--is-embedding``."""

    family: ClassVar[Family] = "embedding"
    loadtime_options = options_for("embedding")
    served_task: ClassVar[Task] = "encode"
    added_flags = ("--is-embedding",)

    @classmethod
    def engine_args(
        cls, loadtime: Mapping[str, Any], runtime: Mapping[str, Any] | None = None
    ) -> tuple[str, ...]:
        return ("--is-embedding",)
