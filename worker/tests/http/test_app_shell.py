"""The shell the worker, the router and the gateway are built in wires every shared piece."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from sie_worker.errors import UnknownModel
from sie_worker.http.app_shell import app_shell


@dataclass(frozen=True)
class _Settings:
    max_body_bytes: int = 16
    api_key: str | None = "key"


async def _echo(request: Request) -> JSONResponse:
    return JSONResponse({"size": len(await request.body())})


async def _unknown(request: Request) -> JSONResponse:
    raise UnknownModel("no model 'm'")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _shell(events: list[str]) -> Starlette:
    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        events.append("start")
        yield
        events.append("stop")

    routes = [
        Route("/healthz", _echo, methods=["GET"]),
        Route("/v1/x", _echo, methods=["POST"]),
        Route("/v1/unknown", _unknown, methods=["GET"]),
    ]
    return app_shell(routes, _Settings(), lifespan)


def _client(app: Starlette) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


@pytest.mark.anyio
async def test_the_shell_applies_auth_limits_request_ids_and_error_rendering() -> None:
    app = _shell([])
    bearer = {"Authorization": "Bearer key"}
    async with _client(app) as client:
        probe = await client.get("/healthz")
        assert probe.status_code == 200
        assert probe.headers["x-request-id"]
        assert (await client.post("/v1/x", content=b"{}")).status_code == 401
        assert (await client.post("/v1/x", content=b"{}", headers=bearer)).status_code == 200
        too_big = await client.post("/v1/x", content=b"x" * 17, headers=bearer)
        assert too_big.status_code == 413
        unknown = await client.get("/v1/unknown", headers={**bearer, "X-Request-Id": "r1"})
        assert unknown.status_code == 404
        assert unknown.json()["error"]["message"] == "no model 'm'"
        assert unknown.headers["x-request-id"] == "r1"


@pytest.mark.anyio
async def test_the_shell_never_redirects_a_trailing_slash() -> None:
    async with _client(_shell([])) as client:
        answer = await client.post("/v1/x/", content=b"{}", headers={"Authorization": "Bearer key"})
    assert answer.status_code == 404


@pytest.mark.anyio
async def test_the_shell_runs_the_apps_lifespan() -> None:
    events: list[str] = []
    app = _shell(events)
    async with app.router.lifespan_context(app):
        assert events == ["start"]
    assert events == ["start", "stop"]
