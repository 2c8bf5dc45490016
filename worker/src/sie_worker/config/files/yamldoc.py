"""Read one YAML or JSON document into plain JSON data, reporting every problem with a path.

Safe loading only. Dates stay strings (``revision: 2024-01-01`` is a tag name, not a date),
duplicate keys are refused instead of silently keeping the last one, and the result is
rebuilt as fresh dicts/lists of JSON types: non-string keys, non-JSON values, alias cycles
and absurd nesting become problems rather than exceptions further on.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

import yaml

from sie_worker.config.files.jsonpath import json_path
from sie_worker.errors import Problem

__all__ = ["MAX_DEPTH", "MAX_NODES", "load_document", "plain_data"]

MAX_DEPTH = 32
MAX_NODES = 100_000


class _Loader(yaml.SafeLoader):
    """SafeLoader without the timestamp resolver and with duplicate-key detection."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


class _DuplicateKey(yaml.MarkedYAMLError):
    """A mapping repeats a key, or uses a list/mapping as a key."""


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, Hashable):
            raise _DuplicateKey(
                None, None, "a key is a list or mapping; keys must be strings", key_node.start_mark
            )
        if key in seen:
            raise _DuplicateKey(
                None, None, f"duplicate key {key!r}; keep one of them", key_node.start_mark
            )
        seen.add(key)
    return dict(loader.construct_pairs(node, deep=True))


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_document(text: str | bytes) -> tuple[object, list[Problem]]:
    """Parse ``text`` (YAML 1.1 or JSON) into Python data; never raises.

    Returns ``(data, problems)``: problems when the text cannot be parsed at all. The data
    may still hold what JSON cannot carry; :func:`plain_data` finds that.
    """
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            return None, [Problem("$", f"is not UTF-8 text (byte {exc.start}); save it as UTF-8")]
    try:
        documents = list(yaml.load_all(text, Loader=_Loader))
    except yaml.MarkedYAMLError as exc:
        return None, [Problem("$", _yaml_message(exc))]
    except yaml.YAMLError as exc:
        return None, [Problem("$", f"is not valid YAML: {exc}; fix the syntax")]
    except (ValueError, TypeError, OverflowError) as exc:
        return None, [Problem("$", f"is not valid YAML: {exc}; fix the value")]
    except RecursionError:
        return None, [Problem("$", f"is nested too deeply; a model config needs < {MAX_DEPTH}")]
    documents = [d for d in documents if d is not None] or [None]
    if len(documents) > 1:
        return None, [
            Problem("$", f"holds {len(documents)} YAML documents; put one model per file")
        ]
    return documents[0], []


def _yaml_message(exc: yaml.MarkedYAMLError) -> str:
    mark = exc.problem_mark or exc.context_mark
    where = f"line {mark.line + 1} column {mark.column + 1}: " if mark is not None else ""
    what = " ".join(p for p in (exc.context, exc.problem) if p) or "syntax error"
    if isinstance(exc, _DuplicateKey):
        return f"{where}{what}"
    return f"is not valid YAML: {where}{what}; fix the syntax"


def plain_data(value: object) -> tuple[object, list[Problem]]:
    """Copy ``value`` into fresh JSON data; problems for whatever JSON cannot hold."""
    walker = _Walker()
    return walker.copy(value, [], 0), walker.problems


class _Walker:
    def __init__(self) -> None:
        self.problems: list[Problem] = []
        self.nodes = 0
        self.stack: set[int] = set()

    def copy(self, value: object, path: list[str | int], depth: int) -> object:
        self.nodes += 1
        if self.nodes == MAX_NODES + 1:
            self._add(path, f"the document has more than {MAX_NODES} values; trim it")
        if self.nodes > MAX_NODES:
            return None
        if isinstance(value, str):
            return self._text(value, path)
        if value is None or isinstance(value, bool | int):
            return value
        if isinstance(value, float):
            return value  # nan and inf pass through: the rules that need numbers refuse them
        if not isinstance(value, Mapping | list | tuple):
            kind = type(value).__name__
            self._add(path, f"holds a {kind} value, which JSON cannot carry; quote it as a string")
            return None
        if depth >= MAX_DEPTH:
            self._add(path, f"is nested more than {MAX_DEPTH} levels deep; flatten it")
            return None
        if id(value) in self.stack:
            self._add(path, "refers to itself through a YAML alias; write the value out")
            return None
        self.stack.add(id(value))
        try:
            if not isinstance(value, Mapping):
                return [self.copy(item, [*path, i], depth + 1) for i, item in enumerate(value)]
            out: dict[str, object] = {}
            for key, item in value.items():
                if not isinstance(key, str):
                    self._add(path, f"has the key {key!r}, which is not a string; quote the key")
                    continue
                key = self._text(key, path)
                out[key] = self.copy(item, [*path, key], depth + 1)
            return out
        finally:
            self.stack.discard(id(value))

    def _text(self, value: str, path: list[str | int]) -> str:
        # PyYAML keeps JSON's escaped surrogate pairs ("\ud83d\ude00") as two lone
        # surrogates; join them so the value can be encoded, and refuse a lone one.
        if not any("\ud800" <= char <= "\udfff" for char in value):
            return value
        try:
            return value.encode("utf-16", "surrogatepass").decode("utf-16")
        except UnicodeDecodeError:
            self._add(path, "holds an unpaired UTF-16 surrogate escape; write the character itself")
            return value.encode("utf-8", "replace").decode("utf-8")

    def _add(self, path: list[str | int], message: str) -> None:
        self.problems.append(Problem(json_path(path), message))
