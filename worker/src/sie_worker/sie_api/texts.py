"""The text an embedding model reads for one input, as SIE's sentence-transformers adapter
forms it from ``is_query``, ``instruction`` and the model's options. Pure.

1. The instruction is the request's (even ``""``); else, for a query only,
   ``default_instruction``.
2. With a template for the side being encoded (``query_template`` for a query,
   ``doc_template`` for a document): ``template.format(text=..., instruction=...)``; the
   template may use ``{text}`` and ``{instruction}`` only.
3. Else with a sentence-transformers prompt of that name (``query`` / ``document``, from the
   model's ``config_sentence_transformers.json``): the prompt, then the text.
4. Else with an instruction: ``f"{instruction} {text}"``; else the text itself.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["TEXT_OPTIONS", "TextOptions", "check_template", "format_text"]

# The options that shape the text, as SIE spells them (loadtime, runtime or request options).
TEXT_OPTIONS = ("query_template", "doc_template", "default_instruction")
_FIELDS = frozenset({"text", "instruction"})


@dataclass(frozen=True)
class TextOptions:
    query_template: str | None = None
    doc_template: str | None = None
    default_instruction: str | None = None
    prompts: Mapping[str, str] = field(default_factory=dict)  # sentence-transformers prompts


def check_template(template: str) -> str | None:
    """What is wrong with ``template``, or None."""
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as exc:
        return f"is not a valid template ({exc}); write {{text}} and {{instruction}}"
    wrong = sorted({n for n in names if n not in _FIELDS})
    if wrong:
        return f"uses {{{wrong[0]}}}; a template may use {{text}} and {{instruction}} only"
    return None


def format_text(text: str, *, is_query: bool, instruction: str | None, options: TextOptions) -> str:
    if instruction is None and is_query:
        instruction = options.default_instruction
    template = options.query_template if is_query else options.doc_template
    if template:
        return template.format(text=text, instruction=instruction or "")
    prompt = options.prompts.get("query" if is_query else "document")
    if prompt:
        return prompt + text
    if instruction:
        return f"{instruction} {text}"
    return text
