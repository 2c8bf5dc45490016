"""What the worker reads from an inference request before it acquires an engine. Pure.

- :func:`read_payload`: the JSON body, which must be an object naming its ``model``;
- :func:`served_id`: the served model that answers it: a grammar-constrained request
  (``response_format`` of type ``json_schema``, ``json_object``, ``regex`` or ``ebnf``, or
  SGLang's own ``regex``, ``ebnf``, ``json_schema``, ``structural_tag``) sent to a model
  whose config names a ``grammar_profile`` is served by ``<sie_id>:<grammar_profile>``;
  every other request by the model it names;
- :func:`task_of`: the task an endpoint needs (``generate`` or ``encode``);
- :func:`prefer_wait`: ``Prefer: wait=N`` (RFC 7240), how long the client waits for a load.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from sie_worker.config.model import ModelConfig
from sie_worker.errors import InvalidRequest

__all__ = [
    "ENDPOINT_TASKS",
    "is_grammar_constrained",
    "prefer_wait",
    "read_payload",
    "served_id",
    "task_of",
]

ENDPOINT_TASKS: Mapping[str, str] = {
    "/v1/chat/completions": "generate",
    "/v1/completions": "generate",
    "/v1/embeddings": "encode",
}
_GRAMMAR_KEYS = ("regex", "ebnf", "json_schema", "structural_tag")
_GRAMMAR_FORMATS = ("json_schema", "json_object", "regex", "ebnf")
_PREFER_WAIT = re.compile(r"(?:^|[,;\s])wait\s*=\s*(\d+(?:\.\d+)?)", re.IGNORECASE)


def read_payload(body: bytes) -> dict[str, Any]:
    """The request's JSON object; :class:`InvalidRequest` unless it names a ``model``."""
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than Python parses
        raise InvalidRequest("the request body is not valid JSON") from None
    if not isinstance(payload, dict):
        raise InvalidRequest("the request body must be a JSON object")
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("the request body needs a 'model' string (see GET /v1/models)")
    return payload


def is_grammar_constrained(payload: Mapping[str, Any]) -> bool:
    response_format = payload.get("response_format")
    return any(payload.get(k) is not None for k in _GRAMMAR_KEYS) or (
        isinstance(response_format, dict) and response_format.get("type") in _GRAMMAR_FORMATS
    )


def served_id(config: ModelConfig, model_id: str, payload: Mapping[str, Any]) -> str:
    """The served model that answers ``payload`` sent to ``model_id`` (a model of ``config``)."""
    if (
        config.grammar_profile is not None
        and model_id == config.sie_id
        and is_grammar_constrained(payload)
    ):
        return f"{config.sie_id}:{config.grammar_profile}"
    return model_id


def task_of(path: str) -> str:
    return ENDPOINT_TASKS[path]


def prefer_wait(headers: Mapping[str, str]) -> float | None:
    """Seconds from ``Prefer: wait=N``; None when the client did not ask to wait less."""
    prefer = headers.get("prefer")
    if not prefer:
        return None
    match = _PREFER_WAIT.search(prefer)
    return float(match.group(1)) if match else None
