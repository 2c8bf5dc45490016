"""``sie_server.adapters.vllm.embedding:VLLMEmbeddingAdapter``: embeddings.

OpenAI embeddings and SIE's encode from a vLLM engine started with its pooling runner
(``--runner pooling`` in vLLM 0.32; the pooling method comes from the model's own
sentence-transformers files, as vLLM reads them)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from sie_server.adapters.base import Task
from sie_server.adapters.vllm import VLLMAdapter
from sie_worker.engines.vllm.flags import Family, options_for

__all__ = ["VLLMEmbeddingAdapter"]

POOLING_RUNNER = ("--runner", "pooling")


class VLLMEmbeddingAdapter(VLLMAdapter):
    """Embeddings from a vLLM engine started with its pooling runner."""

    family: ClassVar[Family] = "embedding"
    loadtime_options = options_for("embedding")
    served_task: ClassVar[Task] = "encode"
    added_flags = ("--runner",)

    @classmethod
    def engine_args(
        cls, loadtime: Mapping[str, Any], runtime: Mapping[str, Any] | None = None
    ) -> tuple[str, ...]:
        return POOLING_RUNNER
