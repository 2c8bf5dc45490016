"""The text an embedding model reads for one input, as SIE forms it."""

from __future__ import annotations

import pytest

from sie_worker.sie_api.texts import TextOptions, check_template, format_text

TEMPLATES = TextOptions(
    query_template="Instruct: {instruction}\nQuery: {text}",
    doc_template="passage: {text}",
    default_instruction="Find passages",
)


@pytest.mark.parametrize(
    ("is_query", "instruction", "options", "expected"),
    [
        (True, None, TEMPLATES, "Instruct: Find passages\nQuery: x"),
        (True, "Retrieve", TEMPLATES, "Instruct: Retrieve\nQuery: x"),
        (True, "", TEMPLATES, "Instruct: \nQuery: x"),  # an empty instruction is one
        (False, "Retrieve", TEMPLATES, "passage: x"),
        (False, None, TEMPLATES, "passage: x"),
        (True, None, TextOptions(default_instruction="Find"), "Find x"),
        (False, None, TextOptions(default_instruction="Find"), "x"),  # only for queries
        (False, "Represent", TextOptions(), "Represent x"),
        (True, None, TextOptions(prompts={"query": "q: "}), "q: x"),
        (False, None, TextOptions(prompts={"query": "q: ", "document": "d: "}), "d: x"),
        (True, "Find", TextOptions(query_template="{text}!", prompts={"query": "q: "}), "x!"),
        (False, None, TextOptions(), "x"),
    ],
)
def test_templates_then_prompts_then_instructions_shape_the_text(
    is_query: bool, instruction: str | None, options: TextOptions, expected: str
) -> None:
    assert format_text("x", is_query=is_query, instruction=instruction, options=options) == expected


@pytest.mark.parametrize(
    "template", ["{text}", "q: {text}", "{instruction} {text}", "{{x}} {text}"]
)
def test_templates_may_use_text_and_instruction(template: str) -> None:
    assert check_template(template) is None


@pytest.mark.parametrize(
    ("template", "words"),
    [
        ("{query}", "{query}"),
        ("{}", "{}"),
        ("{text.upper}", "{text.upper}"),
        ("{text", "not a valid"),
    ],
)
def test_other_placeholders_are_refused(template: str, words: str) -> None:
    problem = check_template(template)
    assert problem is not None
    assert words in problem
