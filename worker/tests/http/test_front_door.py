"""The front door: request ids, request limits and bearer auth, one middleware."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.testclient import TestClient
from tests.support.asgi_server import serve

from sie_worker.errors import InvalidRequest
from sie_worker.http.front_door import FrontDoor
from sie_worker.http.wire import BodyRewritingMiddleware


async def _echo(request: Request) -> JSONResponse:
    return JSONResponse({"size": len(await request.body())})


def _app(api_key: str | None = None, max_bytes: int = 64) -> Starlette:
    return FrontDoor(
        [Route(p, _echo, methods=["GET", "POST"]) for p in ("/healthz", "/v1/x")],
        max_bytes=max_bytes,
        api_key=api_key,
    )


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _client(app: Starlette) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


@pytest.mark.anyio
async def test_bearer_auth_guards_api_paths_but_not_probes() -> None:
    async with _client(_app(api_key="key")) as client:
        assert (await client.get("/healthz")).status_code == 200
        denied = await client.get("/v1/x")
        assert denied.status_code == 401
        assert denied.json() == {
            "error": {"code": "unauthorized", "message": "missing or invalid bearer token"}
        }
        assert (
            await client.get("/v1/x", headers={"Authorization": "Bearer nope"})
        ).status_code == 401
        assert (await client.get("/v1/x", headers={"Authorization": "key"})).status_code == 401
        assert (
            await client.get("/v1/x", headers={"Authorization": "Bearer key"})
        ).status_code == 200


@pytest.mark.anyio
async def test_without_a_key_everything_is_open() -> None:
    async with _client(_app()) as client:
        assert (await client.get("/v1/x")).status_code == 200


@pytest.mark.anyio
async def test_body_limit_refuses_declared_and_streamed_bodies() -> None:
    async with _client(_app(max_bytes=64)) as client:
        assert (await client.post("/v1/x", content=b"a" * 64)).json() == {"size": 64}
        declared = await client.post("/v1/x", content=b"a" * 65)
        assert declared.status_code == 413
        assert declared.json()["error"]["code"] == "payload_too_large"

        async def chunks():  # type: ignore[no-untyped-def]
            for _ in range(4):
                yield b"b" * 32

        assert (await client.post("/v1/x", content=chunks())).status_code == 413


# -- request ids: every request and every answer carries one, the client's or a new one
async def _seen(request: Request) -> Response:
    return JSONResponse({"seen": request.headers.get("x-request-id")})


async def _fail(request: Request) -> Response:
    raise InvalidRequest("no")


def _id_client() -> TestClient:
    app = FrontDoor([Route("/echo", _seen), Route("/fail", _fail)], max_bytes=1024)
    return TestClient(app)


def test_the_clients_request_id_is_kept_and_returned() -> None:
    with _id_client() as client:
        response = client.get("/echo", headers={"X-Request-Id": "abc-1"})
    assert response.json() == {"seen": "abc-1"}
    assert response.headers["x-request-id"] == "abc-1"


def test_a_request_without_one_gets_one_that_routes_and_answer_share() -> None:
    with _id_client() as client:
        response = client.get("/echo")
    seen = response.json()["seen"]
    assert re.fullmatch(r"[0-9a-f]{32}", seen)
    assert response.headers["x-request-id"] == seen


def test_errors_carry_the_request_id_once() -> None:
    with _id_client() as client:
        response = client.get("/fail", headers={"X-Request-Id": "r-2"})
        missing = client.get("/nowhere")
    assert response.status_code == 400
    assert response.headers.get_list("x-request-id") == ["r-2"]
    assert missing.status_code == 404
    assert len(missing.headers.get_list("x-request-id")) == 1


# -- the wire: streamed bodies go around middleware, which must say it passes them through


class _Gzip:
    def __init__(self, app: Callable[..., object]) -> None:
        self.app = app


def test_the_front_door_keeps_the_wired_apps_rule_on_body_rewriting_middleware() -> None:
    app = FrontDoor(middleware=[Middleware(_Gzip)])  # type: ignore[arg-type]
    with pytest.raises(BodyRewritingMiddleware, match="_Gzip may rewrite"):
        app.build_middleware_stack()


@pytest.mark.anyio
async def test_a_request_still_waiting_when_the_drain_ends_gets_a_json_error() -> None:
    entered = asyncio.Event()

    async def wait_forever(request: Request) -> Response:
        entered.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    app = FrontDoor([Route("/v1/x", wait_forever, methods=["POST"])])
    async with httpx.AsyncClient(timeout=30) as client:
        async with serve(app) as port:  # leaving it stops the server: a 1 s drain
            asking = asyncio.create_task(client.post(f"http://127.0.0.1:{port}/v1/x"))
            await entered.wait()
        answer = await asking
    assert answer.status_code == 502
    error = answer.json()["error"]
    assert error["code"] == "engine_unavailable"
    assert "SIE_DRAIN_TIMEOUT_S" in error["message"]
    assert answer.headers["x-request-id"]


@pytest.mark.anyio
async def test_an_answer_begun_when_the_drain_ends_is_cut_not_finished_with_an_error() -> None:
    async def stream_forever(request: Request) -> Response:
        async def chunks() -> AsyncIterator[bytes]:
            yield b"data: 1\n\n"
            await asyncio.Event().wait()

        return StreamingResponse(chunks(), media_type="text/event-stream")

    app = FrontDoor([Route("/v1/x", stream_forever, methods=["POST"])])
    received: list[bytes] = []
    first = asyncio.Event()

    async def read_all(answer: httpx.Response) -> None:
        async for chunk in answer.aiter_raw():
            received.append(chunk)
            first.set()

    async with httpx.AsyncClient(timeout=30) as client:
        async with serve(app) as port:
            request = client.build_request("POST", f"http://127.0.0.1:{port}/v1/x")
            answer = await client.send(request, stream=True)
            reading = asyncio.create_task(read_all(answer))
            await first.wait()
        with pytest.raises(httpx.RemoteProtocolError):
            await reading
    assert answer.status_code == 200
    assert received == [b"data: 1\n\n"]
