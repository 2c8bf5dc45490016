"""What every relaying app reads from a client request: its body (size-limited) and the
``model`` its JSON body names."""

from __future__ import annotations

import json

from starlette.requests import Request

from sie_worker.errors import InvalidRequest, PayloadTooLarge

__all__ = ["model_of", "read_body"]


def model_of(body: bytes) -> str:
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    model = data.get("model") if isinstance(data, dict) else None
    if not isinstance(model, str) or not model:
        raise InvalidRequest(
            "body: expected a JSON object whose field `model` is the id of the model to use"
        )
    return model


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length", "")
    too_big = PayloadTooLarge(
        f"request body is larger than {limit} bytes (SIE_MAX_BODY_BYTES); send a smaller one"
    )
    if declared.isdigit() and int(declared) > limit:
        raise too_big
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_big
        chunks.append(chunk)
    return b"".join(chunks)
