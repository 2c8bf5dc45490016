"""``sie_server.adapters.sglang.generation:SGLangGenerationAdapter``: text generation.

SIE's generation adapter (SIE's ``sglang`` bundle; here the ``sglang`` bundle, and any
SGLang bundle of this image)."""

from __future__ import annotations

from typing import ClassVar

from sie_server.adapters.base import Task
from sie_server.adapters.sglang import SGLangAdapter

__all__ = ["SGLangGenerationAdapter"]


class SGLangGenerationAdapter(SGLangAdapter):
    """Completions and chat completions from one SGLang engine; accepts tensor_parallel_size."""

    served_task: ClassVar[Task] = "generate"
