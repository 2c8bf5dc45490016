"""The one reader of an OpenAI request body, for the worker, the slot router and the gateway:
a JSON object naming its ``model``, else 400 ``invalid_request`` with one message (the
body's size limit is :mod:`sie_worker.http.front_door`')."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sie_worker.errors import InvalidRequest

__all__ = ["BODY_NEEDS_MODEL", "json_object", "model_in", "model_of", "read_payload"]

BODY_NEEDS_MODEL = (
    "the request body must be a JSON object whose 'model' is the id of a served model "
    "(GET /v1/models lists them)"
)


def json_object(body: bytes) -> dict[str, Any] | None:
    """The JSON object a body holds, else None (not JSON, or not an object)."""
    if body.lstrip()[:1] != b"{":
        return None
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than Python parses
        return None
    return data if isinstance(data, dict) else None


def model_in(payload: Mapping[str, Any] | None) -> str:
    """The ``model`` a request's JSON object names; :class:`InvalidRequest` without one."""
    model = payload.get("model") if payload is not None else None
    if not isinstance(model, str) or not model:
        raise InvalidRequest(BODY_NEEDS_MODEL, param="model")
    return model


def read_payload(body: bytes) -> dict[str, Any]:
    """The body's JSON object, which names a ``model`` (else :class:`InvalidRequest`)."""
    payload = json_object(body)
    if payload is None:
        raise InvalidRequest(BODY_NEEDS_MODEL, param="model")
    model_in(payload)
    return payload


def model_of(body: bytes) -> str:
    """The ``model`` a JSON body names (:func:`model_in`)."""
    return model_in(json_object(body))
