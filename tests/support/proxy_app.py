"""``sie_worker.proxy.forward`` behind a one-route ASGI app, as the worker's app calls it,
for the proxy's tests; the mark that runs a test on both event loops the worker meets; and
:data:`BOTH_PATHS`, the mark that runs a test through both ways an answer leaves the worker:
``asgi`` (httpx's ASGITransport: every write an ASGI message) and ``socket`` (uvicorn on a
real socket, where a stream's body is written to the client's transport directly)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
from sie_worker.config.runtime import RequestRuntime
from sie_worker.errors import SieError
from sie_worker.http.connections import Connections
from sie_worker.http.wire import WiredStarlette
from sie_worker.worker.metrics import StreamTimer
from sie_worker.worker.proxy import Lease, forward
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.support.asgi_server import serve

__all__ = ["BOTH_PATHS", "EVERY_LOOP", "Releases", "client_of", "proxy_app"]

# The worker serves on uvloop (uvicorn picks it when installed), whose transports are not
# asyncio's: code that touches sockets runs its tests on both.
EVERY_LOOP = pytest.mark.parametrize(
    "anyio_backend",
    [("asyncio", {"use_uvloop": False}), ("asyncio", {"use_uvloop": True})],
    ids=["asyncio", "uvloop"],
)
BOTH_PATHS = pytest.mark.parametrize("over", ["asgi", "socket"])


@asynccontextmanager
async def client_of(app: Starlette, over: str) -> AsyncIterator[httpx.AsyncClient]:
    """A client of ``app``, in process (``over="asgi"``) or over uvicorn (``"socket"``)."""
    if over == "asgi":
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://worker"
        ) as client:
            yield client
        return
    async with (
        serve(app, lifespan="off") as port,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False) as client,
    ):
        yield client


class Releases:
    """A lease's ``on_release``: counts how often the lease was given back, and records the
    status it had then (what the request's metrics see)."""

    def __init__(self) -> None:
        self.count = 0
        self.statuses: list[str] = []

    def __call__(self) -> None:
        self.count += 1

    def of(self, lease: Lease) -> None:
        self.count += 1
        self.statuses.append(lease.status)


def proxy_app(
    base_url: str,
    releases: Releases,
    *,
    read_timeout: float | None = 5.0,
    runtime: RequestRuntime | None = None,
    timer: StreamTimer | None = None,
    connections: Connections | None = None,
) -> Starlette:
    """``POST /v1/completions`` forwarded to the engine at ``base_url`` for model ``org/m``
    with request id ``rid-1``; ``stream`` as the body says; design errors as JSON. JSON
    answers and streams alike go to ``base_url`` over the engine's kept-alive
    ``connections`` (None: a new connection per request); ``runtime`` is the served
    model's; ``timer`` times the stream's writes."""

    async def endpoint(request: Request) -> Response:
        body = await request.body()
        lease = Lease(
            "org/m",
            base_url,
            read_timeout,
            on_release=lambda: releases.of(lease),
            timer=None if timer is None else lambda model, started: timer,
            connections=connections,
        )
        try:
            return await forward(
                lease,
                "/v1/completions",
                body,
                request.headers,
                stream=json.loads(body).get("stream") is True,
                request_id="rid-1",
                runtime=runtime,
            )
        except SieError as error:
            return JSONResponse(error.body(), status_code=error.status)

    return WiredStarlette(routes=[Route("/v1/completions", endpoint, methods=["POST"])])
