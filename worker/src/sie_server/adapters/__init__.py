"""Adapters a model config names in ``adapter_path`` (``module:Class``), under SIE's paths.

| adapter_path                                                       | engine       |
|--------------------------------------------------------------------|--------------|
| ``sie_server.adapters.sglang.generation:SGLangGenerationAdapter``  | SGLang       |
| ``sie_server.adapters.sglang.embedding:SGLangEmbeddingAdapter``    | SGLang       |
| ``sie_server.adapters.sglang.gemma:SGLangGemmaAdapter``            | SGLang 0.5.20+ |
| ``sie_server.adapters.sglang.cuda13:SGLangCuda13Adapter``          | SGLang 0.5.20+ |
| ``sie_server.adapters.sglang.cuda13:SGLangStrictThinkingAdapter``  | SGLang 0.5.20+ |
| ``sie_server.adapters.sglang.chat:SGLangChatAdapter`` (ours)       | SGLang       |
| ``sie_server.adapters.transformers:TransformersAdapter`` (ours)    | transformers |
| SIE's plain encoders and cross-encoders (``sentence_transformer``, | transformers |
| ``bert_flash``, ``xlm_roberta_flash``, ``modernbert_flash``,       |              |
| ``bert_flash_cross_encoder``, ``cross_encoder``,                   |              |
| ``modernbert_flash_cross_encoder``)                                |              |

Every other adapter SIE defines is known to :mod:`sie_worker.config.adapters` as data.
"""

from __future__ import annotations

from sie_server.adapters.base import Adapter

__all__ = ["Adapter"]
