"""What every relaying app reads from a client request: the ``model`` its JSON body names
(the body's size limit is :mod:`sie_worker.http.request_limits`')."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sie_worker.errors import InvalidRequest

__all__ = ["json_object", "model_in", "model_of"]


def json_object(body: bytes) -> dict[str, Any] | None:
    """The JSON object a body holds, else None (not JSON, or not an object)."""
    if body.lstrip()[:1] != b"{":
        return None
    try:
        data = json.loads(body)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def model_in(payload: Mapping[str, Any] | None) -> str:
    """The ``model`` a request's JSON object names; :class:`InvalidRequest` without one."""
    model = payload.get("model") if payload is not None else None
    if not isinstance(model, str) or not model:
        raise InvalidRequest(
            "body: expected a JSON object whose field `model` is the id of the model to use"
        )
    return model


def model_of(body: bytes) -> str:
    """The ``model`` a JSON body names (:func:`model_in`)."""
    return model_in(json_object(body))
