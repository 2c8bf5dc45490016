"""The worker's one inference path, for the OpenAI routes and SIE's native ones alike:

    read the request -> the served model that answers it -> a lease on its engine -> forward

An OpenAI request is relayed as it is (its ``model`` set to the served id when grammar
routing picked another). An SIE request (``/v1/encode``, ``/v1/score``, ``/v1/generate``,
the model in the path) is read by :mod:`sie_worker.sie_api`, which says which engine request
serves it and how the answer comes back. Both then share placement, loading, pins, limits,
leases, metrics and errors.
"""

from __future__ import annotations

import json
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from sie_worker.config.adapters import NotServedHere, UnknownAdapter
from sie_worker.config.files.jsonpath import json_path
from sie_worker.config.load.load_options import adapter_of
from sie_worker.config.lora import BASE_ADAPTER
from sie_worker.config.lora_choice import (
    ADAPTER_FIELD,
    ADAPTER_FIELDS,
    request_adapter,
    unknown_adapter,
)
from sie_worker.config.model import ServedModel
from sie_worker.config.runtime import is_grammar_constrained
from sie_worker.engines.family import EngineFamily
from sie_worker.engines.registry import family_of
from sie_worker.errors import InvalidConfig, InvalidRequest, ModelLoading, Problem, UnknownModel
from sie_worker.http.front_door import REQUEST_ID_HEADER
from sie_worker.http.request import read_payload
from sie_worker.settings import Settings
from sie_worker.sie_api.call import EngineCall
from sie_worker.sie_api.codec import decode_body, wants_json
from sie_worker.sie_api.encode import encode_call, parse_encode
from sie_worker.sie_api.generate import generate_call, parse_generate
from sie_worker.sie_api.ids import resolve_model_id, split_model, with_profile
from sie_worker.sie_api.score import parse_score, score_call
from sie_worker.worker.manager import ModelManager
from sie_worker.worker.proxy import forward, open_lease
from sie_worker.worker.records import ModelRecord
from sie_worker.worker.request import ENGINE_TASKS, load_wait

__all__ = ["SIE_PATHS", "openai_request", "resolve_sie_model", "sie_request"]

# SIE's native inference routes (the model in the path may contain '/').
SIE_PATHS = {
    "encode": "/v1/encode/{model:path}",
    "score": "/v1/score/{model:path}",
    "generate": "/v1/generate/{model:path}",
}


async def openai_request(request: Request) -> Response:
    """An OpenAI request. Its ``model`` resolves as SIE's ids do (exactly first), else as
    SGLang's ``<served id>:<adapter>``; the adapter it names (that suffix, SGLang's
    ``lora_path``, or sie-sdk's ``lora_adapter``) goes to the engine as ``lora_path``."""
    started = time.monotonic()
    _manager(request).group.require_leader()
    return await _serve(request, started, openai=await request.body())


def _openai_call(
    request: Request, manager: ModelManager, body: bytes
) -> tuple[ModelRecord, EngineCall, bytes | None, str]:
    """The record an OpenAI body names, its engine call, the body to relay unchanged (None:
    rewrite it) and the field that named its adapter."""
    payload = read_payload(body)
    named = payload["model"]
    # A served id as written is what SIE's rules and SGLang's find first: the usual case.
    asked = manager.records.get(named)
    from_model = None
    if asked is None:
        model_id = resolve_model_id(named, manager.records)
        if model_id is None and (split := split_model(named, manager.records)) is not None:
            model_id, from_model = split
        asked = manager.records.get(model_id or named)
        if asked is None:
            raise UnknownModel.not_configured(named)
    raw: bytes | None = body if asked.id == named else None
    named_adapter = from_model is not None or any(f in payload for f in ADAPTER_FIELDS)
    adapter = request_adapter(payload, from_model) if named_adapter else None
    param = "model" if from_model is not None else ADAPTER_FIELD
    if from_model is None and payload.get(ADAPTER_FIELD) is None:
        param = "lora_adapter"
    if adapter is not None or "lora_adapter" in payload:
        payload = {k: v for k, v in payload.items() if k != "lora_adapter"}
        if adapter is not None:
            payload[ADAPTER_FIELD] = adapter
        raw = None
    path: str = request.scope["path"]  # request.url would parse the Host header too
    return asked, EngineCall(path, payload, stream=payload.get("stream") is True), raw, param


async def sie_request(request: Request) -> Response:
    started = time.monotonic()
    route = request.scope["path"].split("/", 3)[2]  # /v1/<route>/<model>
    _manager(request).group.require_leader()
    data = decode_body(await request.body(), request.headers.get("content-type"))
    manager = _manager(request)
    settings: Settings = request.app.state.settings
    as_json = wants_json(request.headers.get("accept"))
    model = request.path_params["model"]
    headers: dict[str, str] = {}
    call: EngineCall
    if route == "encode":
        encode = parse_encode(data)
        asked = resolve_sie_model(manager, model, encode.profile)
        family = _family(asked.served, settings)
        call = encode_call(encode, asked.served, family=family, as_json=as_json, headers=headers)
    elif route == "score":
        score = parse_score(data)
        asked = resolve_sie_model(manager, model, score.profile)
        family = _family(asked.served, settings)
        call = score_call(score, asked.served, family=family, as_json=as_json, headers=headers)
    else:
        generate = parse_generate(data)
        asked = resolve_sie_model(manager, model, generate.profile, generate=True)
        call = generate_call(
            generate, asked.served, request_id=request.headers[REQUEST_ID_HEADER], started=started
        )
    return await _serve(request, started, sie=(asked, call))


def resolve_sie_model(
    manager: ModelManager, model: str, profile: str | None, *, generate: bool = False
) -> ModelRecord:
    """The record an SIE path names (:mod:`sie_worker.sie_api.ids`)."""
    model_id = resolve_model_id(with_profile(model, profile), manager.records, generate=generate)
    if model_id is None:
        raise UnknownModel.not_configured(model)
    return manager.record(model_id)  # the SIE routes: not the OpenAI request's path


async def _serve(
    request: Request,
    started: float,
    *,
    openai: bytes | None = None,
    sie: tuple[ModelRecord, EngineCall] | None = None,
) -> Response:
    """Either route's request, in the order its bytes flow: the served model (grammar
    routing, the task and adapter checks), a lease on its engine, the engine call.
    ``openai``: an OpenAI body (relayed unchanged when the served model is the one it
    names); ``sie``: an SIE request's record and engine call (its body is the engine's
    JSON, not the client's). The adapter a request names must be one of the served
    model's. Both routes refuse first on a rank >= 1 of a group of nodes (``not_leader``),
    before reading the body."""
    manager = _manager(request)
    if sie is None:
        asked, call, raw, param = _openai_call(request, manager, openai or b"")
    else:
        (asked, call), raw, param = sie, None, ADAPTER_FIELD
    # The served model's facts are data on its record: nothing is worked out per request.
    model_id = asked.facts.grammar_id if is_grammar_constrained(call.payload) else asked.id
    record = asked if model_id == asked.id else manager.records.get(model_id)
    if record is None:
        raise UnknownModel.not_configured(model_id)
    facts = record.facts
    task = ENGINE_TASKS[call.path]
    if task not in facts.tasks:
        raise InvalidRequest(
            f"{model_id} does not serve {request.url.path}: its config declares tasks "
            f"{sorted(facts.tasks)}, not {task!r}"
        )
    adapter = call.payload.get(ADAPTER_FIELD)
    label = BASE_ADAPTER
    if isinstance(adapter, str):
        if adapter not in facts.adapters:
            raise unknown_adapter(record.id, facts.adapters, adapter, param=param)
        label = adapter
    if raw is not None and model_id == asked.id:
        body = raw
    else:
        payload = {**call.payload, "model": model_id}
        if isinstance(adapter, str) and _names_lora_as_model(record, request.app.state.settings):
            payload["model"] = payload.pop(ADAPTER_FIELD)  # vLLM: the adapter's own name
        body = json.dumps(payload).encode()
    headers: Any = request.headers if sie is None else {"content-type": "application/json"}
    running = record.running if record.state == "ready" else None
    if running is None:  # the cold path: wait for its load (a warm request never waits)
        wait_s = load_wait(request.headers, sie_route=sie is not None)
        try:
            running = await manager.hold(record, started=started, wait_s=wait_s, adapter=label)
        except ModelLoading as exc:
            raise ModelLoading(
                f"{model_id} is still loading after {wait_s:g} s; retry after Retry-After "
                "(sie-sdk does), or send 'Prefer: wait=N' to wait up to N s",
                retry_after_s=int(exc.headers.get("Retry-After", "5")),
            ) from None
    lease = open_lease(record, running, manager.metrics, started=started, adapter=label)
    return await forward(
        lease,
        call.path,
        body,
        headers,
        stream=call.stream,
        request_id=request.headers[REQUEST_ID_HEADER],
        runtime=facts.runtime,
        answer=call.answer,
        events=call.events,
        decode=call.decode,
    )


def _manager(request: Request) -> ModelManager:
    manager: ModelManager = request.app.state.manager
    return manager


def _names_lora_as_model(record: ModelRecord, settings: Settings) -> bool:
    """Whether the model's engine takes a request's LoRA adapter as its ``model`` (vLLM)."""
    try:
        return family_of(adapter_of(record.served, settings).engine).lora_as_model
    except (UnknownAdapter, NotServedHere):
        return False


def _family(served: ServedModel, settings: Settings) -> EngineFamily:
    """The engine family serving ``served``. A profile whose adapter this image does not run
    is refused as its load would refuse it (no engine ever serves it)."""
    try:
        return family_of(adapter_of(served, settings).engine)
    except (UnknownAdapter, NotServedHere) as exc:
        where = json_path(["profiles", served.profile.name, "adapter_path"])
        raise InvalidConfig([Problem(where, str(exc), served.config.source)]) from None
