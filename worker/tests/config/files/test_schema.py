"""The model-config schema the worker validates every config against."""

from __future__ import annotations

import json

from jsonschema import Draft202012Validator

from sie_worker.config.files.schema import schema_path, schema_problems


def test_the_shipped_schema_is_a_valid_draft_2020_12_schema() -> None:
    # The worker does not check it at start-up (it ships with the package): this does.
    Draft202012Validator.check_schema(json.loads(schema_path().read_text(encoding="utf-8")))


def test_an_integer_written_as_a_float_is_a_problem_naming_its_path() -> None:
    problems = schema_problems({"sie_id": "x", "max_sequence_length": 2.0})
    assert any("max_sequence_length" in str(problem) for problem in problems), problems
