"""OpenAI response bodies and server-sent-event chunks. Pure: plain dicts and strings."""

from __future__ import annotations

import array
import base64
import json
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any

__all__ = [
    "DONE",
    "chat_chunk",
    "chat_response",
    "completion_chunk",
    "completion_response",
    "embedding_item",
    "embeddings_response",
    "new_id",
    "sse",
    "usage",
]

DONE = "data: [DONE]\n\n"


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def embedding_item(index: int, vector: Sequence[float], encoding_format: str) -> dict[str, Any]:
    if encoding_format == "base64":
        # OpenAI's base64 form: float32 bytes (the openai client asks for it by default)
        packed = array.array("f", vector)
        if sys.byteorder == "big":  # pragma: no cover - the wire format is little-endian
            packed.byteswap()
        data: Any = base64.b64encode(packed.tobytes()).decode("ascii")
    else:
        data = list(vector)
    return {"object": "embedding", "index": index, "embedding": data}


def embeddings_response(
    model: str, items: list[dict[str, Any]], prompt_tokens: int
) -> dict[str, Any]:
    return {
        "object": "list",
        "data": items,
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }


def completion_response(
    *,
    rid: str,
    model: str,
    choices: list[tuple[str, str]],
    prompt_tokens: int,
    completion_tokens: int,
) -> dict[str, Any]:
    """``choices``: (text, finish_reason) per prompt."""
    return {
        "id": rid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": i, "text": text, "logprobs": None, "finish_reason": reason}
            for i, (text, reason) in enumerate(choices)
        ],
        "usage": usage(prompt_tokens, completion_tokens),
    }


def completion_chunk(
    *, rid: str, model: str, text: str, finish_reason: str | None, created: int
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}],
    }


def chat_response(
    *,
    rid: str,
    model: str,
    text: str,
    finish_reason: str,
    prompt_tokens: int,
    completion_tokens: int,
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        ],
        "usage": usage(prompt_tokens, completion_tokens),
    }


def chat_chunk(
    *, rid: str, model: str, delta: dict[str, str], finish_reason: str | None, created: int
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
    }
