"""``sie_server.adapters.sglang.chat:SGLangChatAdapter``: generation with a chosen chat template.

This project's adapter (SIE has none by this name), built on the generation adapter."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from sie_server.adapters.sglang.generation import SGLangGenerationAdapter
from sie_worker.engines.sglang.flags import Family, options_for

__all__ = ["SGLangChatAdapter"]


class SGLangChatAdapter(SGLangGenerationAdapter):
    """The generation adapter plus ``chat_template`` (an SGLang built-in name or a file path),
    for models whose tokenizer carries no chat template or the wrong one."""

    family: ClassVar[Family] = "chat"
    loadtime_options = options_for("chat")

    @classmethod
    def engine_args(
        cls, loadtime: Mapping[str, Any], runtime: Mapping[str, Any] | None = None
    ) -> tuple[str, ...]:
        template = loadtime.get("chat_template")
        return ("--chat-template", str(template)) if template else ()
