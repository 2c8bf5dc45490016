"""``sie_server.adapters.vllm.generation:VLLMGenerationAdapter``: text generation.

OpenAI chat and completions, and SIE's generate, from one vLLM engine (the ``vllm``
bundle); accepts tensor_parallel_size."""

from __future__ import annotations

from typing import ClassVar

from sie_server.adapters.base import Task
from sie_server.adapters.vllm import VLLMAdapter

__all__ = ["VLLMGenerationAdapter"]


class VLLMGenerationAdapter(VLLMAdapter):
    """Completions and chat completions from one vLLM engine."""

    served_task: ClassVar[Task] = "generate"
