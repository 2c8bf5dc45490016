"""``sie_server.adapters.sglang.chat:SGLangChatAdapter``: generation with a chosen chat template."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sie_server.adapters.sglang import SGLANG_LOADTIME_OPTIONS
from sie_server.adapters.sglang.generation import SGLangGenerationAdapter

__all__ = ["SGLangChatAdapter"]


class SGLangChatAdapter(SGLangGenerationAdapter):
    """The generation adapter plus ``chat_template`` (an SGLang built-in name or a file path),
    for models whose tokenizer carries no chat template or the wrong one."""

    loadtime_options = (*SGLANG_LOADTIME_OPTIONS, "chat_template")

    @classmethod
    def engine_args(cls, loadtime: Mapping[str, Any]) -> tuple[str, ...]:
        template = loadtime.get("chat_template")
        return ("--chat-template", str(template)) if template else ()
