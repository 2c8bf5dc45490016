"""The model-config JSON Schema: where it lives, and its errors rewritten as readable problems.

The schema ships as package data (``sie_worker/schemas/``, force-included from the repo's
``schemas/`` when the wheel is built); an editable install reads the repo's ``schemas/``.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from sie_worker.config.files.json_types import type_name
from sie_worker.config.files.jsonpath import json_path
from sie_worker.errors import Problem

__all__ = ["MODEL_CONFIG_SCHEMA", "schema_path", "schema_problems", "type_name"]

MODEL_CONFIG_SCHEMA = "model-config.schema.json"

# Hints for keys a config must have, by the path of the object that lacks them.
_REQUIRED_HINTS: Mapping[tuple[str, str], str] = {
    ("$", "sie_id"): "add sie_id: the model id clients send, e.g. my-org/my-model",
    ("$", "tasks"): "add tasks with generate, encode or score",
    ("$", "profiles"): "add profiles, e.g. a default profile (served as the model's sie_id)",
}


def schema_path(name: str = MODEL_CONFIG_SCHEMA) -> Path:
    """The schema file: package data in a wheel, else the repository's ``schemas/``."""
    package = Path(__file__).resolve().parents[2]  # sie_worker/
    for candidate in (package / "schemas" / name, package.parents[2] / "schemas" / name):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"{name} is neither in {package / 'schemas'} nor in the repository")


@cache
def _validator() -> Draft202012Validator:
    # why: not checked against the meta-schema here (a tenth of a worker's start-up CPU):
    # the schema ships with the package, and worker/tests/config/files/test_schema.py checks it
    schema = json.loads(schema_path().read_text(encoding="utf-8"))
    # JSON Schema counts 2.0 as an integer; a config should say 2.
    checker = Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda _checker, value: isinstance(value, int) and not isinstance(value, bool)
    )
    cls = jsonschema.validators.extend(  # type: ignore[no-untyped-call]  # untyped in stubs
        Draft202012Validator, type_checker=checker
    )
    validator: Draft202012Validator = cls(schema)
    return validator


def schema_problems(data: object) -> list[Problem]:
    """Every schema violation of ``data`` as a problem with a path and a fix."""
    problems: dict[Problem, None] = {}
    for error in _validator().iter_errors(data):
        problems.update(dict.fromkeys(_describe(error)))
    return list(problems)


def _describe(error: ValidationError) -> Iterator[Problem]:
    parts: list[str | int] = list(error.absolute_path)
    if "propertyNames" in error.absolute_schema_path and isinstance(error.instance, str):
        parts.append(error.instance)  # point at the offending key itself
    path = json_path(parts)
    schema: Mapping[str, Any] = error.schema if isinstance(error.schema, Mapping) else {}
    instance = error.instance
    keyword = error.validator
    if keyword == "additionalProperties" and isinstance(instance, Mapping):
        allowed = sorted(schema.get("properties", {}))
        for key in sorted(k for k in instance if k not in allowed):
            close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]}?" if close else "allowed keys: " + ", ".join(allowed)
            yield Problem(json_path([*parts, key]), f"unknown key; {hint}")
        return
    if keyword == "required" and isinstance(instance, Mapping):
        # One error per missing key, each carrying the whole list: the caller dedupes.
        required: list[Any] = list(error.validator_value)  # type: ignore[arg-type]
        for missing in (str(k) for k in required if k not in instance):
            hint = _REQUIRED_HINTS.get((path, missing), f"add {missing}")
            yield Problem(json_path([*parts, missing]), f"is required; {hint}")
        return
    yield Problem(path, _message(keyword, schema, error))


def _message(keyword: Any, schema: Mapping[str, Any], error: ValidationError) -> str:
    instance: Any = error.instance
    value: Any = error.validator_value
    shown = _shown(instance)
    if "x-message" in schema and keyword in ("pattern", "propertyNames", "minLength"):
        return f"{schema['x-message']}, got {shown}"
    if keyword == "type":
        return _type_message(value, instance)
    if keyword == "enum":
        options = ["null" if v is None else str(v) for v in value]
        close = difflib.get_close_matches(str(instance), options, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else ""
        return f"must be one of {', '.join(options)}, got {shown}{hint}"
    if keyword == "minimum":
        return f"must be at least {value}, got {shown}"
    if keyword == "maximum":
        return f"must be at most {value}, got {shown}"
    if keyword == "minLength":
        return "must not be empty"
    if keyword == "maxLength":
        return f"must be at most {value} characters long, got {len(instance)}; shorten it"
    if keyword == "maxItems":
        return f"must hold at most {value} items, got {len(instance)}; remove some"
    if keyword == "minProperties":
        return "must not be empty"
    if keyword == "pattern":
        return f"must match {value}, got {shown}"
    return error.message


def _type_message(expected: Any, instance: object) -> str:
    names = [expected] if isinstance(expected, str) else list(expected)
    wanted = next((n for n in names if n != "null"), "null")
    word = _TYPE_WORDS.get(wanted, wanted)
    if len(names) > 1:
        word = " or ".join(_TYPE_WORDS.get(n, n) for n in names)
    article = "an" if word[0] in "aeiou" else "a"
    hint = ""
    if wanted == "string" and isinstance(instance, int | float | bool):
        hint = "; quote it"
    elif wanted == "integer" and isinstance(instance, float):
        hint = "; write a whole number without a decimal point"
    elif wanted == "integer" and isinstance(instance, str):
        hint = "; write the number without quotes"
    elif wanted == "object":
        hint = "; write a mapping of key: value lines"
    elif wanted == "array":
        hint = '; write a list, e.g. ["--flag", "value"]'
    return f"must be {article} {word}, got {type_name(instance)}" + (_value_suffix(instance) + hint)


_TYPE_WORDS = {"object": "mapping", "array": "list"}


def _value_suffix(instance: object) -> str:
    if isinstance(instance, dict | list) or instance is None:
        return ""
    return f" {_shown(instance)}"


def _shown(value: object) -> str:
    """A short rendering of a value for messages (JSON spelling, cut at 60 characters)."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=True)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
