"""The router over real sockets (uvicorn on 127.0.0.1): streaming, disconnects, hung slots.

Router and fake worker run in the test's event loop, so the worker can hold a stream open
until the test has seen the first event through the router: a router that buffered would
never deliver it (the guard timeout fails the test, no timing is asserted).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio
import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from tests.support.asgi_server import serve

from sie_worker.router.app import create_router_app
from sie_worker.router.settings import RouterSettings

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class StreamingWorker:
    """Streams one event, waits for ``proceed``, then finishes; can stop answering at all."""

    proceed: anyio.Event = field(default_factory=anyio.Event)
    hung: anyio.Event = field(default_factory=anyio.Event)  # set: polls and streams stall
    closed: anyio.Event = field(default_factory=anyio.Event)  # set when a stream ends early
    finished: bool = False
    headers_seen: list[tuple[str, str]] = field(default_factory=list)

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/readyz", self._readyz),
                Route("/v1/models", self._models),
                Route("/v1/devices", self._devices),
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
            ]
        )

    async def _stall_if_hung(self) -> None:
        if self.hung.is_set():
            await anyio.sleep_forever()

    async def _readyz(self, request: Request) -> Response:
        await self._stall_if_hung()
        return JSONResponse({"status": "ready"})

    async def _models(self, request: Request) -> Response:
        await self._stall_if_hung()
        entry = {
            "id": "m",
            "object": "model",
            "state": "ready",
            "devices": ["cuda:0"],
            "width": 1,
            "pinned": False,
            "error": None,
        }
        return JSONResponse({"object": "list", "data": [entry]})

    async def _devices(self, request: Request) -> Response:
        await self._stall_if_hung()
        return JSONResponse({"devices": [{"device": "cuda:0", "model": "m"}]})

    async def _chat(self, request: Request) -> Response:
        await request.body()
        self.headers_seen = [(k.lower(), v) for k, v in request.headers.items()]

        async def events() -> AsyncIterator[str]:
            try:
                yield 'data: {"n": 0}\n\n'
                await self.proceed.wait()
                await self._stall_if_hung()
                yield 'data: {"n": 1}\n\n'
                yield "data: [DONE]\n\n"
                self.finished = True
            finally:
                if not self.finished:
                    self.closed.set()

        return StreamingResponse(events(), media_type="text/event-stream")


@asynccontextmanager
async def router_before(
    worker: StreamingWorker, *, poll_timeout_s: float = 2.0
) -> AsyncIterator[httpx.AsyncClient]:
    async with serve(worker.app(), lifespan="off") as worker_port:
        settings = RouterSettings(
            worker_ports=(worker_port,), poll_interval_s=0.05, poll_timeout_s=poll_timeout_s
        )
        async with (
            serve(create_router_app(settings)) as router_port,
            httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{router_port}", trust_env=False, timeout=10
            ) as client,
        ):
            yield client


_CHAT = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


async def _lines(response: httpx.Response) -> AsyncIterator[str]:
    async for line in response.aiter_lines():
        if line:
            yield line


async def test_stream_events_arrive_before_the_worker_finishes() -> None:
    worker = StreamingWorker()
    async with router_before(worker) as client:
        with anyio.fail_after(20):
            async with client.stream("POST", "/v1/chat/completions", json=_CHAT) as r:
                assert r.headers["x-sie-slot"] == "0"
                lines = _lines(r)
                assert await anext(lines) == 'data: {"n": 0}'
                worker.proceed.set()
                assert [line async for line in lines] == ['data: {"n": 1}', "data: [DONE]"]
    assert worker.finished


async def test_client_leaving_mid_stream_closes_the_worker_stream() -> None:
    worker = StreamingWorker()
    async with router_before(worker) as client:
        with anyio.fail_after(20):
            async with client.stream("POST", "/v1/chat/completions", json=_CHAT) as r:
                assert await anext(_lines(r)) == 'data: {"n": 0}'
            await worker.closed.wait()
    assert not worker.finished


async def test_stream_on_a_slot_that_stops_answering_ends_with_engine_unavailable() -> None:
    worker = StreamingWorker()
    async with router_before(worker, poll_timeout_s=0.3) as client:
        with anyio.fail_after(20):
            async with client.stream("POST", "/v1/chat/completions", json=_CHAT) as r:
                lines = _lines(r)
                assert await anext(lines) == 'data: {"n": 0}'
                worker.hung.set()  # polls stall too: the router takes the slot out
                worker.proceed.set()
                rest = [line async for line in lines]
    assert len(rest) == 1
    error = json.loads(rest[0].removeprefix("data: "))
    assert error["error"]["code"] == "engine_unavailable"
    assert "slot 0" in error["error"]["message"]


async def test_the_router_passes_end_to_end_headers_and_drops_hop_by_hop_ones() -> None:
    worker = StreamingWorker()
    worker.proceed.set()
    sent = {
        "Connection": "keep-alive, X-Trace-Hop",
        "X-Trace-Hop": "router-only",
        "Keep-Alive": "timeout=5",
        "TE": "trailers",
        "Proxy-Authorization": "Basic dXNlcjpwYXNz",
        "X-SIE-Slot": "0",  # the router reads it (pins the slot) and keeps it
        "X-Tenant": "team-a",
        "Authorization": "Bearer k",
    }
    async with router_before(worker) as client:
        with anyio.fail_after(20):
            r = await client.post("/v1/chat/completions", json=_CHAT, headers=sent)
    assert r.status_code == 200
    seen = dict(worker.headers_seen)
    assert seen["x-tenant"] == "team-a"
    assert seen["authorization"] == "Bearer k"
    assert not {"x-trace-hop", "keep-alive", "te", "proxy-authorization", "x-sie-slot"} & set(seen)
    # The router frames its own request: one Host, one Content-Length, no Expect.
    names = [k for k, _ in worker.headers_seen]
    assert names.count("host") == 1
    assert names.count("content-length") == 1
