from __future__ import annotations

import httpx
import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from sie_worker.http.auth import BearerAuth
from sie_worker.http.request_limits import RequestLimits


async def _echo(request: Request) -> JSONResponse:
    return JSONResponse({"size": len(await request.body())})


def _app(api_key: str | None = None, max_bytes: int = 64) -> Starlette:
    return Starlette(
        routes=[Route(p, _echo, methods=["GET", "POST"]) for p in ("/healthz", "/v1/x")],
        middleware=[
            Middleware(RequestLimits, max_bytes=max_bytes),
            Middleware(BearerAuth, api_key=api_key),
        ],
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
