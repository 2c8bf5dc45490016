"""Adapters a model config names in ``adapter_path`` (``module:Class``).

| adapter_path                                                       | engine       |
|--------------------------------------------------------------------|--------------|
| ``sie_server.adapters.sglang.generation:SGLangGenerationAdapter``  | SGLang       |
| ``sie_server.adapters.sglang.embedding:SGLangEmbeddingAdapter``    | SGLang       |
| ``sie_server.adapters.sglang.chat:SGLangChatAdapter``              | SGLang       |
| ``sie_server.adapters.transformers:TransformersAdapter``           | transformers |
"""

from __future__ import annotations

from sie_server.adapters.base import Adapter

__all__ = ["Adapter"]
