"""One request as a hop routes it, read once: :class:`RoutedRequest`.

The slot router and the gateway read a request that names a model the same way, once per
hop, in :func:`read_routed` (the first step of their one path: parse -> resolve -> choose
-> relay):

- the body, and its JSON object parsed once (:func:`~sie_worker.http.request.read_payload`
  on the OpenAI routes, with its one 400; an SIE route's JSON body, else none: MessagePack
  is not read);
- the model by the one model-id rule (:func:`~sie_worker.sie_api.ids.served_or_asked`) over
  the ids the hop knows; on the OpenAI routes ``<served id>:<adapter>`` splits into the
  model the request is placed as and its LoRA adapter (SGLang's rule);
- its prompt's prefix blocks (:mod:`sie_worker.backends.prefix`, hashed with the model and
  adapter), its session key (:func:`session_key`) and whether it asks for a stream.

It is the :class:`~sie_worker.http.relay.Upstream` the relay sends, so nothing is read
again on the way out.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from sie_worker.backends.prefix import PrefixConfig, prompt_blocks
from sie_worker.errors import NotFound
from sie_worker.http.headers import forward_headers
from sie_worker.http.relay import Upstream
from sie_worker.http.request import json_object, read_payload
from sie_worker.sie_api.ids import served_or_asked, split_model

__all__ = [
    "MODEL_ACTIONS",
    "SESSION_FIELDS",
    "RoutedRequest",
    "model_action",
    "read_routed",
    "request_target",
    "session_key",
]

# What POST /v1/models/<id>/<action> may ask of a model, at the router and the gateway.
MODEL_ACTIONS = ("load", "unload", "pin", "unpin")

# Where a session key comes from, after the X-Session-Id header: JSON body fields.
SESSION_FIELDS = ("user", "prompt_cache_key", "routing_key")


@dataclass(frozen=True)
class RoutedRequest(Upstream):
    """What a hop sends (:class:`Upstream`: ``model`` is the one it is placed as) and what
    its choice reads."""

    adapter: str | None = None  # the LoRA adapter of ``<model>:<adapter>``
    prefix: tuple[int, ...] = ()  # the prompt's block hashes; (): none, or prefix routing off
    session: str | None = None
    stream: bool = False
    payload: Mapping[str, Any] | None = None  # the JSON body (None: not JSON)


async def read_routed(
    request: Request,
    known: Collection[str],
    prefix: PrefixConfig,
    *,
    target: str | None = None,
) -> RoutedRequest:
    """The request a route that names a model received: the OpenAI routes by the body's
    ``model``, the SIE ones (``/v1/<route>/{model}``) by the path. ``known``: the served ids
    this hop knows; ``target``: what to send upstream (default: the raw path and query)."""
    body = await request.body()  # its size limit: FrontDoor
    asked = request.path_params.get("model")
    adapter = None
    payload: Mapping[str, Any] | None
    if asked is None:  # an OpenAI route
        openai = read_payload(body)
        payload = openai
        model = served_or_asked(openai["model"], known)
        # A LoRA adapter's request (model:adapter) goes where its base model is.
        split = split_model(model, known)
        if split is not None:
            model, adapter = split
    else:
        json = "json" in request.headers.get("content-type", "")
        payload = json_object(body) if json else None
        generate = request.scope["path"].startswith("/v1/generate/")
        model = served_or_asked(asked, known, generate=generate)
    hashed = model if adapter is None else f"{model}:{adapter}"
    return RoutedRequest(
        method=request.method,
        target=target if target is not None else request_target(request),
        headers=forward_headers(request.scope["headers"]),  # X-Request-Id: see FrontDoor
        body=body,
        model=model,
        adapter=adapter,
        prefix=prompt_blocks(prefix, hashed, payload),
        session=session_key(request.headers, payload),
        stream=payload is not None and payload.get("stream") is True,
        payload=payload,
    )


def request_target(request: Request) -> str:
    """The raw path and query, as the client sent them."""
    raw_path: bytes = request.scope.get("raw_path") or request.scope["path"].encode()
    path = raw_path.decode("latin-1").split("?", 1)[0]
    query = request.scope.get("query_string", b"").decode("latin-1")
    return f"{path}?{query}" if query else path


def session_key(headers: Mapping[str, str], payload: Mapping[str, Any] | None) -> str | None:
    """``X-Session-Id``, else the first of :data:`SESSION_FIELDS` in the JSON body that is
    a nonempty string."""
    header = headers.get("x-session-id", "").strip()
    if header:
        return header
    if payload is None:
        return None
    for name in SESSION_FIELDS:
        value = payload.get(name)
        if isinstance(value, str) and value:
            return f"{name}:{value}"
    return None


def model_action(rest: str, known: Collection[str]) -> tuple[str, str]:
    """The model (by the one model-id rule) and the action of ``POST /v1/models/{rest}``;
    :class:`NotFound` unless ``rest`` is ``<id>/<action>`` with one of :data:`MODEL_ACTIONS`."""
    model, _, action = rest.rpartition("/")
    if action not in MODEL_ACTIONS or not model:
        raise NotFound(f"POST /v1/models/{rest}: use /v1/models/<id>/{{{','.join(MODEL_ACTIONS)}}}")
    return served_or_asked(model, known), action
