"""Parse OpenAI request bodies into frozen requests; every refusal names the field and the fix.

Pure: no torch. Fields the engine cannot honour are refused rather than silently ignored
(``n`` above 1, penalties, logprobs, tools); fields with no effect on a single local model
(``model``, ``user``) are accepted and ignored.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from sie_worker.engines.transformers._errors import EngineError
from sie_worker.sie_api.texts import TEXT_OPTIONS, check_template

__all__ = [
    "ChatMessage",
    "ChatRequest",
    "CompletionRequest",
    "EmbeddingRequest",
    "RerankRequest",
    "Sampling",
    "parse_chat",
    "parse_completion",
    "parse_embedding",
    "parse_rerank",
    "render_chat_fallback",
    "requested_adapter",
]

EncodingFormat = Literal["float", "base64"]
_CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass(frozen=True)
class EmbeddingRequest:
    """``is_query``, ``instructions`` (one per text) and the text options are this engine's
    own fields (the worker sends them for SIE's encode): how each text is shaped."""

    texts: tuple[str, ...]
    encoding_format: EncodingFormat
    dimensions: int | None
    is_query: tuple[bool, ...] | None = None  # None: not sent (texts are used as they are)
    instructions: tuple[str | None, ...] | None = None
    text_options: Mapping[str, str] = field(default_factory=dict)
    normalize: bool | None = None


@dataclass(frozen=True)
class RerankRequest:
    query: str
    documents: tuple[str, ...]


@dataclass(frozen=True)
class Sampling:
    """Generation settings. ``max_tokens`` None means "up to the context length"."""

    max_tokens: int | None
    temperature: float
    top_p: float
    stop: tuple[str, ...]
    seed: int | None


@dataclass(frozen=True)
class CompletionRequest:
    prompts: tuple[str, ...]  # a list prompt gives one choice per prompt
    sampling: Sampling
    stream: bool
    include_usage: bool


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str


@dataclass(frozen=True)
class ChatRequest:
    messages: tuple[ChatMessage, ...]
    sampling: Sampling
    stream: bool
    include_usage: bool


def parse_embedding(body: object) -> EmbeddingRequest:
    data = _object(body)
    raw = data.get("input")
    if isinstance(raw, str):
        texts: tuple[str, ...] = (raw,)
    elif isinstance(raw, list) and raw and all(isinstance(item, str) for item in raw):
        texts = tuple(raw)
    elif isinstance(raw, list) and raw:
        raise EngineError(
            "input: token-id arrays are not supported by this engine; send text "
            "(a string or a list of strings)",
            param="input",
        )
    else:
        raise EngineError("input: required; a string or a nonempty list of strings", param="input")
    fmt = data.get("encoding_format", "float") or "float"
    if fmt not in ("float", "base64"):
        raise EngineError(
            f"encoding_format: {fmt!r} is not supported; use 'float' or 'base64'",
            param="encoding_format",
        )
    dimensions = _optional_int(data, "dimensions", minimum=1)
    return EmbeddingRequest(
        texts=texts,
        encoding_format=cast(EncodingFormat, fmt),
        dimensions=dimensions,
        is_query=_per_text(data, "is_query", len(texts), bool),
        instructions=_per_text(data, "instruction", len(texts), str),
        text_options=_text_options(data),
        normalize=_optional_flag(data, "normalize"),
    )


def parse_rerank(body: object) -> RerankRequest:
    """SGLang's ``/v1/rerank`` body: ``{query, documents, return_documents?, top_n?}``."""
    data = _object(body)
    query = data.get("query")
    if not isinstance(query, str):
        raise EngineError("query: required; a string", param="query")
    documents = data.get("documents")
    if (
        not isinstance(documents, list)
        or not documents
        or not all(isinstance(d, str) for d in documents)
    ):
        raise EngineError("documents: required; a nonempty list of strings", param="documents")
    if data.get("top_n") is not None:
        raise EngineError("top_n: not supported by this engine; omit it", param="top_n")
    return RerankRequest(query=query, documents=tuple(documents))


def _per_text(data: Mapping[str, Any], key: str, count: int, kind: type) -> tuple[Any, ...] | None:
    """One value per text: a single value for all, or a list of ``count`` (null entries are
    the default); None when the field is not sent."""
    value = data.get(key)
    if value is None:
        return None
    values = value if isinstance(value, list) else [value] * count
    if len(values) != count or not all(v is None or isinstance(v, kind) for v in values):
        name = kind.__name__
        raise EngineError(
            f"{key}: a {name}, or a list of {count} ({name} or null), one per input", param=key
        )
    return tuple(values)


def _text_options(data: Mapping[str, Any]) -> dict[str, str]:
    options: dict[str, str] = {}
    for key in TEXT_OPTIONS:
        value = data.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise EngineError(f"{key}: must be a string", param=key)
        problem = check_template(value) if key.endswith("_template") else None
        if problem is not None:
            raise EngineError(f"{key} {problem}", param=key)
        options[key] = value
    return options


def _optional_flag(data: Mapping[str, Any], key: str) -> bool | None:
    value = data.get(key)
    if value is None or isinstance(value, bool):
        return value
    raise EngineError(f"{key}: must be true or false", param=key)


def parse_completion(body: object) -> CompletionRequest:
    data = _object(body)
    raw = data.get("prompt")
    if isinstance(raw, str):
        prompts: tuple[str, ...] = (raw,)
    elif isinstance(raw, list) and raw and all(isinstance(item, str) for item in raw):
        prompts = tuple(raw)
    elif isinstance(raw, list) and raw:
        raise EngineError(
            "prompt: token-id arrays are not supported by this engine; send text",
            param="prompt",
        )
    else:
        raise EngineError(
            "prompt: required; a string or a nonempty list of strings", param="prompt"
        )
    _refuse_unless(data, "echo", (None, False), "echo: not supported; omit it or send false")
    _refuse_unless(data, "best_of", (None, 1), "best_of: only 1 is supported")
    _refuse_unless(data, "suffix", (None, ""), "suffix: not supported by this engine; omit it")
    _refuse_unless(data, "logprobs", (None, False), "logprobs: not supported by this engine")
    stream = _flag(data, "stream")
    if stream and len(prompts) > 1:
        raise EngineError(
            "prompt: streaming takes one prompt; send a string, or set stream to false",
            param="prompt",
        )
    return CompletionRequest(
        prompts=prompts,
        sampling=_sampling(data, max_tokens_keys=("max_tokens",), default_max_tokens=16),
        stream=stream,
        include_usage=_include_usage(data),
    )


def parse_chat(body: object) -> ChatRequest:
    data = _object(body)
    raw = data.get("messages")
    if not isinstance(raw, list) or not raw:
        raise EngineError(
            "messages: required; a nonempty list of {role, content} objects", param="messages"
        )
    messages = tuple(_message(item, index) for index, item in enumerate(raw))
    _refuse_unless(data, "logprobs", (None, False), "logprobs: not supported by this engine")
    if data.get("tools"):
        raise EngineError("tools: tool calling is not supported by this engine", param="tools")
    fmt = data.get("response_format")
    if fmt is not None and not (isinstance(fmt, Mapping) and fmt.get("type") == "text"):
        raise EngineError(
            "response_format: only {'type': 'text'} is supported by this engine",
            param="response_format",
        )
    return ChatRequest(
        messages=messages,
        sampling=_sampling(
            data, max_tokens_keys=("max_completion_tokens", "max_tokens"), default_max_tokens=None
        ),
        stream=_flag(data, "stream"),
        include_usage=_include_usage(data),
    )


def requested_adapter(body: object, served_name: str) -> str | None:
    """The LoRA adapter a generation request names, as SGLang reads it: ``model``
    ``<served name>:<adapter>`` first, else the ``lora_path`` field; None for the base."""
    data = _object(body)
    model = data.get("model")
    if isinstance(model, str) and model.startswith(f"{served_name}:"):
        named = model[len(served_name) + 1 :].strip()
        if named:
            return named
    value = data.get("lora_path")
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise EngineError("lora_path: must be an adapter name (a string)", param="lora_path")
    return value.strip()


def render_chat_fallback(messages: tuple[ChatMessage, ...]) -> str:
    """The prompt for a tokenizer without a chat template: ``role: content`` lines, then
    ``assistant:`` for the model to continue."""
    lines = [f"{message.role}: {message.content}" for message in messages]
    return "\n".join([*lines, "assistant:"])


def _object(body: object) -> Mapping[str, Any]:
    if not isinstance(body, Mapping):
        raise EngineError("request body: must be a JSON object")
    return body


def _message(item: object, index: int) -> ChatMessage:
    where = f"messages[{index}]"
    if not isinstance(item, Mapping):
        raise EngineError(f"{where}: must be an object with role and content", param="messages")
    role = item.get("role")
    if role not in _CHAT_ROLES:
        raise EngineError(
            f"{where}.role: {role!r} is not a chat role; use one of {', '.join(_CHAT_ROLES)}",
            param="messages",
        )
    content = item.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):
        text = "".join(_text_part(part, f"{where}.content[{n}]") for n, part in enumerate(content))
    else:
        raise EngineError(
            f"{where}.content: must be a string or a list of text parts", param="messages"
        )
    return ChatMessage(role=str(role), content=text)


def _text_part(part: object, where: str) -> str:
    if (
        isinstance(part, Mapping)
        and part.get("type") == "text"
        and isinstance(part.get("text"), str)
    ):
        return str(part["text"])
    raise EngineError(
        f"{where}: only text parts ({{'type': 'text', 'text': ...}}) are supported by this engine",
        param="messages",
    )


def _sampling(
    data: Mapping[str, Any], *, max_tokens_keys: tuple[str, ...], default_max_tokens: int | None
) -> Sampling:
    _refuse_unless(data, "n", (None, 1), "n: only 1 is supported; send one request per choice")
    for key in ("presence_penalty", "frequency_penalty"):
        _refuse_unless(data, key, (None, 0, 0.0), f"{key}: not supported by this engine; omit it")
    max_tokens = default_max_tokens
    for key in max_tokens_keys:
        value = _optional_int(data, key, minimum=1)
        if value is not None:
            max_tokens = value
            break
    temperature = _number(data, "temperature", default=1.0, low=0.0, high=2.0)
    top_p = _number(data, "top_p", default=1.0, low=0.0, high=1.0)
    if top_p == 0.0:
        raise EngineError("top_p: must be above 0 and at most 1", param="top_p")
    return Sampling(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        stop=_stops(data.get("stop")),
        seed=_optional_int(data, "seed", minimum=None),
    )


def _stops(raw: object) -> tuple[str, ...]:
    if raw is None:
        return ()
    if isinstance(raw, str):
        raw = [raw]
    if isinstance(raw, list) and all(isinstance(item, str) and item for item in raw):
        return tuple(raw)
    raise EngineError("stop: a nonempty string or a list of nonempty strings", param="stop")


def _include_usage(data: Mapping[str, Any]) -> bool:
    options = data.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, Mapping):
        raise EngineError("stream_options: must be an object", param="stream_options")
    return bool(options.get("include_usage", False))


def _flag(data: Mapping[str, Any], key: str) -> bool:
    value = data.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise EngineError(f"{key}: must be true or false", param=key)
    return value


def _optional_int(data: Mapping[str, Any], key: str, *, minimum: int | None) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise EngineError(f"{key}: must be an integer, got {value!r}", param=key)
    if minimum is not None and value < minimum:
        raise EngineError(f"{key}: must be at least {minimum}, got {value}", param=key)
    return value


def _number(data: Mapping[str, Any], key: str, *, default: float, low: float, high: float) -> float:
    value = data.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise EngineError(f"{key}: must be a number from {low:g} to {high:g}", param=key)
    if not low <= value <= high:
        raise EngineError(f"{key}: must be from {low:g} to {high:g}, got {value:g}", param=key)
    return float(value)


def _refuse_unless(
    data: Mapping[str, Any], key: str, allowed: tuple[object, ...], message: str
) -> None:
    value = data.get(key)
    # why: bool is an int, so True == 1 would pass for n/best_of without the type check
    if any(value == ok and type(value) is type(ok) for ok in allowed) or value is None:
        return
    raise EngineError(message, param=key)
