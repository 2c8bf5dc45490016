"""The proxy against a mock engine (httpx.MockTransport), served through a tiny ASGI app."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sie_worker.errors import SieError
from sie_worker.proxy import Lease, forward

Handler = Callable[[httpx.Request], httpx.Response]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class _Releases:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


def _app(handler: Handler, releases: _Releases, read_timeout: float | None = 5.0) -> Starlette:
    engine = httpx.AsyncClient(transport=httpx.MockTransport(handler))

    async def endpoint(request: Request) -> Response:
        body = await request.body()
        lease = Lease("org/m", "http://engine", read_timeout, releases)
        try:
            return await forward(
                engine,
                lease,
                "/v1/completions",
                body,
                request.headers,
                stream=json.loads(body).get("stream") is True,
                request_id="rid-1",
            )
        except SieError as error:
            return JSONResponse(error.body(), status_code=error.status)

    return Starlette(routes=[Route("/v1/completions", endpoint, methods=["POST"])])


async def _post(app: Starlette, stream: bool = False) -> httpx.Response:
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://worker"
    ) as client:
        return await client.post(
            "/v1/completions", json={"model": "org/m", "prompt": "x", "stream": stream}
        )


def _sse(*events: bytes) -> AsyncIterator[bytes]:
    async def generate() -> AsyncIterator[bytes]:
        for event in events:
            yield event

    return generate()


@pytest.mark.anyio
async def test_json_answer_is_relayed_with_the_request_id() -> None:
    seen: dict[str, str] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen["id"] = request.headers["x-request-id"]
        seen["auth"] = request.headers.get("authorization", "")
        return httpx.Response(200, json={"choices": [{"text": "hi"}]})

    releases = _Releases()
    response = await _post(_app(handler, releases))
    assert response.status_code == 200
    assert response.json() == {"choices": [{"text": "hi"}]}
    assert response.headers["x-request-id"] == "rid-1"
    assert seen == {"id": "rid-1", "auth": ""}
    assert releases.count == 1


@pytest.mark.parametrize(
    ("status", "body", "expected_status", "code"),
    [
        (400, {"error": {"message": "bad max_tokens"}}, 400, "invalid_request"),
        (404, {"object": "error", "message": "no such route"}, 404, "invalid_request"),
        (413, {"detail": "too big"}, 413, "payload_too_large"),
        (500, {"error": "boom"}, 502, "engine_unavailable"),
        (503, b"<html>oops</html>", 502, "engine_unavailable"),
    ],
)
@pytest.mark.anyio
async def test_engine_errors_become_design_errors(
    status: int, body: object, expected_status: int, code: str
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if isinstance(body, bytes):
            return httpx.Response(status, content=body)
        return httpx.Response(status, json=body)

    releases = _Releases()
    response = await _post(_app(handler, releases))
    assert response.status_code == expected_status
    assert response.json()["error"]["code"] == code
    assert response.json()["error"]["message"].startswith("org/m: ")
    assert releases.count == 1


@pytest.mark.anyio
async def test_malformed_json_from_the_engine_is_a_clean_502() -> None:
    releases = _Releases()
    response = await _post(_app(lambda r: httpx.Response(200, content=b"{not json"), releases))
    assert response.status_code == 502
    assert "not JSON" in response.json()["error"]["message"]
    assert releases.count == 1


@pytest.mark.parametrize(
    ("exception", "status", "code"),
    [
        (httpx.ReadTimeout("slow"), 504, "engine_timeout"),
        (httpx.ConnectError("refused"), 502, "engine_unavailable"),
        (httpx.ConnectTimeout("no answer"), 502, "engine_unavailable"),
        (httpx.RemoteProtocolError("gone"), 502, "engine_unavailable"),
    ],
)
@pytest.mark.anyio
async def test_transport_failures_are_translated(
    exception: Exception, status: int, code: str
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise exception

    releases = _Releases()
    response = await _post(_app(handler, releases))
    assert response.status_code == status
    assert response.json()["error"]["code"] == code
    assert releases.count == 1


@pytest.mark.anyio
async def test_stream_relays_whole_events_even_when_split_across_chunks() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200,
            headers={"content-type": "text/event-stream"},
            content=_sse(b'data: {"a"', b': 1}\n\ndata: {"b": 2}\n', b"\ndata: [DONE]\n\n"),
        )

    releases = _Releases()
    response = await _post(_app(handler, releases), stream=True)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.text == 'data: {"a": 1}\n\ndata: {"b": 2}\n\ndata: [DONE]\n\n'
    assert releases.count == 1


@pytest.mark.anyio
async def test_read_cap_mid_stream_ends_with_one_error_event_at_an_event_boundary() -> None:
    async def stalled() -> AsyncIterator[bytes]:
        yield b'data: {"n": 1}\n\ndata: {"partial'
        raise httpx.ReadTimeout("stalled")

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=stalled())

    releases = _Releases()
    response = await _post(_app(handler, releases, read_timeout=1.5), stream=True)
    events = [e for e in response.text.split("\n\n") if e.strip()]
    assert events[0] == 'data: {"n": 1}'
    error = json.loads(events[-1].removeprefix("data: "))["error"]
    assert error["code"] == "engine_timeout"
    assert "request_read_timeout_s=1.5s" in error["message"]
    assert releases.count == 1


@pytest.mark.parametrize(
    ("chunks", "what"),
    [
        ((b"this is not sse\n\n",), "not server-sent events"),
        ((b'data: {"n": 1}\n\n', b"data: trailing"), "truncated"),
    ],
)
@pytest.mark.anyio
async def test_malformed_streams_end_with_an_error_event(
    chunks: tuple[bytes, ...], what: str
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=_sse(*chunks))

    releases = _Releases()
    response = await _post(_app(handler, releases), stream=True)
    last = [e for e in response.text.split("\n\n") if e.strip()][-1]
    error = json.loads(last.removeprefix("data: "))["error"]
    assert error["code"] == "engine_unavailable"
    assert what in error["message"]
    assert releases.count == 1
