"""What an engine's error answer means for the client: a 413 stays 413, another 4xx keeps its
status as ``invalid_request`` (404, 422...), anything else is ``engine_unavailable`` (502);
each with the engine's own message (OpenAI's ``error.message``, FastAPI's ``detail``...)."""

from __future__ import annotations

import json

from sie_worker.errors import EngineUnavailable, InvalidRequest, PayloadTooLarge, SieError

__all__ = ["engine_error"]


def engine_error(model: str, status: int, content: bytes) -> SieError:
    """The client's error for an engine's error answer, with the engine's own message."""
    message = _engine_message(content) or f"engine answered HTTP {status}"
    message = f"{model}: {message}"
    if status == 413:
        return PayloadTooLarge(message)
    if 400 <= status < 500:
        return InvalidRequest(message, status=status)  # keep the engine's 4xx (404, 422...)
    return EngineUnavailable(f"{message} (engine HTTP {status})")


def _engine_message(content: bytes) -> str | None:
    try:
        payload = json.loads(content)
    except ValueError:
        text = content[:300].decode("utf-8", "replace").strip()
        return text or None
    if isinstance(payload, dict):
        error = payload.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(error, str):
            return error
        for key in ("message", "detail"):
            if isinstance(payload.get(key), str):
                return str(payload[key])
    return None
