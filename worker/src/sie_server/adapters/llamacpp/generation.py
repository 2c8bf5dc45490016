"""``sie_server.adapters.llamacpp.generation:LlamaCppGenerationAdapter``: text generation.

OpenAI chat and completions, and SIE's generate, from one llama-server (the ``llamacpp``
bundle) serving the model's GGUF file (``gguf_file``); accepts tensor_parallel_size,
tensor_split and split_mode."""

from __future__ import annotations

from typing import ClassVar

from sie_server.adapters.base import Task
from sie_server.adapters.llamacpp import LlamaCppAdapter

__all__ = ["LlamaCppGenerationAdapter"]


class LlamaCppGenerationAdapter(LlamaCppAdapter):
    """Completions and chat completions from one llama-server."""

    served_task: ClassVar[Task] = "generate"
