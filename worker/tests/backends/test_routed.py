"""One request as a hop routes it, read once: model by the one rule, adapter, prefix blocks,
session key, stream flag."""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.requests import Request

from sie_worker.backends.prefix import PrefixConfig, prompt_blocks
from sie_worker.backends.routed import model_action, read_routed, session_key
from sie_worker.errors import AmbiguousModel, InvalidRequest, NotFound
from sie_worker.http.request import BODY_NEEDS_MODEL

pytestmark = pytest.mark.anyio

KNOWN = frozenset({"Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-7B:fast", "Org/M", "org/m"})
PREFIX = PrefixConfig(block_chars=4, index_blocks=100)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _request(
    path: str, body: bytes, *, content_type: str = "application/json", query: bytes = b""
) -> Request:
    scope: dict[str, Any] = {
        "type": "http",
        "method": "POST",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query,
        "headers": [(b"content-type", content_type.encode()), (b"x-session-id", b"s1")],
    }
    if not path.startswith(("/v1/completions", "/v1/chat/completions")):
        scope["path_params"] = {"model": path.split("/", 3)[3]}
    sent = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return sent.pop(0)

    return Request(scope, receive)


async def test_an_openai_request_is_read_once_into_everything_routing_needs() -> None:
    payload = {"model": "qwen/qwen2.5-7b:sql", "prompt": "abcdefghij", "stream": True}
    body = json.dumps(payload).encode()
    routed = await read_routed(_request("/v1/completions", body, query=b"a=1"), KNOWN, PREFIX)
    # <served id>:<adapter> splits only as written (SGLang's rule, and the worker's)
    assert (routed.model, routed.adapter) == ("qwen/qwen2.5-7b:sql", None)
    exact = {"model": "Qwen/Qwen2.5-7B:sql", "prompt": "abcdefghij", "stream": True}
    routed = await read_routed(
        _request("/v1/completions", json.dumps(exact).encode(), query=b"a=1"), KNOWN, PREFIX
    )
    assert (routed.model, routed.adapter, routed.stream) == ("Qwen/Qwen2.5-7B", "sql", True)
    assert routed.prefix == prompt_blocks(PREFIX, "Qwen/Qwen2.5-7B:sql", exact)
    assert routed.session == "s1"
    assert (routed.target, routed.body, routed.payload) == (
        "/v1/completions?a=1",
        json.dumps(exact).encode(),
        exact,
    )


async def test_a_profile_in_another_case_resolves_and_a_twin_in_case_is_ambiguous() -> None:
    body = json.dumps({"model": "qwen/qwen2.5-7b:FAST", "prompt": "x"}).encode()
    routed = await read_routed(_request("/v1/completions", body), KNOWN, PREFIX)
    assert (routed.model, routed.adapter) == ("Qwen/Qwen2.5-7B:fast", None)
    body = json.dumps({"model": "ORG/M", "prompt": "x"}).encode()
    with pytest.raises(AmbiguousModel, match="Org/M, org/m"):
        await read_routed(_request("/v1/completions", body), KNOWN, PREFIX)


async def test_a_body_without_a_model_is_the_one_invalid_request() -> None:
    with pytest.raises(InvalidRequest, match="the request body must be a JSON object") as info:
        await read_routed(_request("/v1/completions", b"[1]"), KNOWN, PREFIX)
    assert info.value.message == BODY_NEEDS_MODEL


async def test_an_sie_request_names_its_model_in_the_path() -> None:
    routed = await read_routed(
        _request("/v1/generate/qwen__qwen2.5-7b", b"\x81\xa6prompt\xa1x", content_type="x"),
        KNOWN,
        PREFIX,
    )
    assert (routed.model, routed.payload, routed.stream) == ("Qwen/Qwen2.5-7B", None, False)
    routed = await read_routed(
        _request("/v1/encode/nobody/knows:default", b'{"items": []}'), KNOWN, PREFIX
    )
    assert (routed.model, routed.payload) == ("nobody/knows", {"items": []})


def test_the_session_key_is_the_header_else_a_body_field() -> None:
    assert session_key({"x-session-id": " s "}, {"user": "u"}) == "s"
    assert session_key({}, {"user": "", "prompt_cache_key": "k"}) == "prompt_cache_key:k"
    assert session_key({}, None) is None


def test_a_model_call_names_a_model_by_the_one_rule_and_an_action() -> None:
    assert model_action("qwen/qwen2.5-7b/load", KNOWN) == ("Qwen/Qwen2.5-7B", "load")
    assert model_action("nobody/knows:default/unpin", KNOWN) == ("nobody/knows", "unpin")
    with pytest.raises(NotFound, match=r"use /v1/models/<id>/\{load,unload,pin,unpin\}"):
        model_action("org/m/reload", KNOWN)
    with pytest.raises(AmbiguousModel):
        model_action("ORG/M/pin", KNOWN)
