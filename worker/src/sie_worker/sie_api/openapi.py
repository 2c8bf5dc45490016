"""The OpenAPI description of SIE's native routes (``/v1/encode``, ``/v1/score``,
``/v1/generate``), part of the worker's ``/openapi.json``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sie_worker.sie_api.models import SIE_STATES
from sie_worker.sie_api.vectors import OUTPUT_DTYPES

__all__ = ["SIE_SCHEMAS", "sie_paths"]

_SIE_MODEL = {
    "name": "model",
    "in": "path",
    "required": True,
    "description": (
        "A served model id as sie-sdk sends it: sie_id, or <sie_id>:<profile>; may contain "
        "'/' (generate writes it '__'). Matched exactly first, then case-insensitively."
    ),
    "schema": {"type": "string", "minLength": 1},
}
_SIE_ERRORS = (400, 401, 404, 409, 413, 502, 503, 504)
_ITEM = {
    "type": "object",
    "required": ["text"],
    "properties": {"id": {"type": "string"}, "text": {"type": "string"}, "metadata": {}},
}
SIE_SCHEMAS: dict[str, Any] = {
    "EncodeRequest": {
        "type": "object",
        "required": ["items"],
        "additionalProperties": False,
        "properties": {
            "items": {"type": "array", "minItems": 1, "items": _ITEM},
            "params": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "output_types": {"type": "array", "items": {"const": "dense"}},
                    "instruction": {"type": "string"},
                    "output_dtype": {"enum": list(OUTPUT_DTYPES)},
                    "options": {
                        "type": "object",
                        "description": (
                            "is_query, profile, instruction, normalize, query_template, "
                            "doc_template, default_instruction; other keys are ignored"
                        ),
                        "properties": {
                            "is_query": {"type": "boolean"},
                            "profile": {"type": "string"},
                            "normalize": {"type": "boolean"},
                        },
                    },
                },
            },
        },
    },
    "EncodeResponse": {
        "type": "object",
        "required": ["model", "items"],
        "properties": {
            "model": {"type": "string"},
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["dense"],
                    "properties": {
                        "id": {"type": "string"},
                        "dense": {
                            "type": "object",
                            "required": ["dims", "dtype", "values"],
                            "properties": {
                                "dims": {"type": "integer"},
                                "dtype": {"type": "string"},
                                "values": {"type": "array", "items": {"type": "number"}},
                            },
                        },
                    },
                },
            },
            "usage": {"type": "object"},
        },
    },
    "ScoreRequest": {
        "type": "object",
        "required": ["query", "items"],
        "additionalProperties": False,
        "properties": {
            "query": _ITEM,
            "items": {"type": "array", "minItems": 1, "items": _ITEM},
            "instruction": {"type": "string"},
            "options": {"type": "object", "properties": {"profile": {"type": "string"}}},
        },
    },
    "ScoreResponse": {
        "type": "object",
        "required": ["model", "scores"],
        "properties": {
            "model": {"type": "string"},
            "query_id": {"type": ["string", "null"]},
            "scores": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["item_id", "score", "rank"],
                    "properties": {
                        "item_id": {"type": "string"},
                        "score": {"type": "number"},
                        "rank": {"type": "integer", "minimum": 0},
                    },
                },
            },
            "usage": {"type": "object"},
        },
    },
    "GenerateRequest": {
        "type": "object",
        "required": ["prompt", "max_new_tokens"],
        "properties": {
            "prompt": {"type": "string", "minLength": 1},
            "max_new_tokens": {"type": "integer", "minimum": 1},
            "temperature": {"type": "number"},
            "top_p": {"type": "number"},
            "stop": {"type": "array", "items": {"type": "string", "minLength": 1}},
            "seed": {"type": "integer"},
            "stream": {"type": "boolean"},
            "grammar": {"type": "object"},
            "lora_adapter": {"type": "string"},
            "options": {"type": "object"},
        },
    },
    "GenerateResponse": {
        "type": "object",
        "required": ["model", "text", "finish_reason", "usage"],
        "properties": {
            "model": {"type": "string"},
            "text": {"type": "string"},
            "finish_reason": {"type": "string"},
            "usage": {"type": "object"},
        },
    },
    "ModelInfo": {
        "type": "object",
        "required": ["name", "loaded", "state", "inputs", "outputs", "dims", "profiles"],
        "properties": {
            "name": {"type": "string"},
            "loaded": {"type": "boolean"},
            "state": {"enum": sorted(set(SIE_STATES.values()))},
            "last_error": {"type": ["object", "null"]},
            "inputs": {"type": "array", "items": {"type": "string"}},
            "outputs": {"type": "array", "items": {"type": "string"}},
            "dims": {"type": "object", "additionalProperties": {"type": "integer"}},
            "max_sequence_length": {"type": ["integer", "null"]},
            "revision": {"type": ["string", "null"]},
            "profiles": {"type": "object"},
            "capabilities": {"type": ["object", "null"]},
        },
    },
}


def _route(
    errors: Callable[..., dict[str, Any]],
    summary: str,
    request: str,
    response: str,
    *,
    stream: bool = False,
) -> dict[str, Any]:
    body = {"$ref": f"#/components/schemas/{request}"}
    answer = {"$ref": f"#/components/schemas/{response}"}
    content: dict[str, Any] = {"application/json": {"schema": answer}}
    if stream:
        content["text/event-stream"] = {"schema": {"type": "string"}}
    else:
        content["application/msgpack"] = {"schema": {"type": "string", "format": "binary"}}
    return {
        "post": {
            "summary": summary,
            "description": (
                "SIE's native API (what sie-sdk calls). The body is MessagePack "
                "(Content-Type: application/msgpack) or JSON; the answer is MessagePack unless "
                "Accept prefers JSON"
                + (", or server-sent events with stream: true" if stream else "")
                + ". Loads on demand like the OpenAI routes; a load longer than 120 s (or "
                "Prefer: wait=N) answers 503 MODEL_LOADING with Retry-After."
            ),
            "parameters": [_SIE_MODEL],
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {"schema": body},
                    "application/msgpack": {"schema": body},
                },
            },
            "responses": {
                "200": {"description": "SIE's answer", "content": content},
                **errors(*_SIE_ERRORS),
            },
        }
    }


def sie_paths(errors: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    """The paths; ``errors(*statuses)`` describes the error answers."""
    return {
        "/v1/encode/{model}": _route(
            errors, "SIE encode: dense vectors", "EncodeRequest", "EncodeResponse"
        ),
        "/v1/score/{model}": _route(
            errors, "SIE score: items ranked for a query", "ScoreRequest", "ScoreResponse"
        ),
        "/v1/generate/{model}": _route(
            errors,
            "SIE generate: text, or SIE's stream chunks",
            "GenerateRequest",
            "GenerateResponse",
            stream=True,
        ),
    }
