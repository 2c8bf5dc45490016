"""The streaming relay's hot path: coalesced writes, backpressure, disconnects, connections.

The proxy is driven through raw ASGI calls so that each ``http.response.body`` message (one
socket write in uvicorn) can be counted, with a mock engine (``httpx.MockTransport``).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import anyio.lowlevel
import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sie_worker.proxy import Lease, forward

Handler = Callable[[httpx.Request], httpx.Response]
Message = dict[str, Any]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class _Releases:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


def _app(handler: Handler, releases: _Releases) -> Starlette:
    engine = httpx.AsyncClient(transport=httpx.MockTransport(handler))

    async def endpoint(request: Request) -> Response:
        body = await request.body()
        lease = Lease("org/m", "http://engine", 5.0, releases)
        return await forward(
            engine,
            lease,
            "/v1/completions",
            body,
            request.headers,
            stream=json.loads(body).get("stream") is True,
            request_id="rid-1",
        )

    return Starlette(routes=[Route("/v1/completions", endpoint, methods=["POST"])])


def _scope() -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/completions",
        "raw_path": b"/v1/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 1234),
        "server": ("127.0.0.1", 8080),
    }


def _receiver(stream: bool, disconnect: anyio.Event) -> Callable[[], Any]:
    body = json.dumps({"model": "org/m", "prompt": "x", "stream": stream}).encode()
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await disconnect.wait()
        return {"type": "http.disconnect"}

    return receive


def _events(n: int, size: int = 0) -> list[bytes]:
    pad = "x" * size
    return [f'data: {{"n": {i}, "pad": "{pad}"}}\n\n'.encode() for i in range(n)]


@pytest.mark.anyio
async def test_events_that_arrive_together_leave_in_one_write() -> None:
    async def burst() -> AsyncIterator[bytes]:
        for event in [*_events(5), b"data: [DONE]\n\n"]:
            yield event  # no await between events: they are all there at once

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=burst())

    releases, messages = _Releases(), []

    async def send(message: Message) -> None:
        messages.append(message)

    await _app(handler, releases)(_scope(), _receiver(True, anyio.Event()), send)
    bodies = [m["body"] for m in messages if m["type"] == "http.response.body" and m["body"]]
    assert bodies == [b"".join([*_events(5), b"data: [DONE]\n\n"])]
    assert releases.count == 1


@pytest.mark.anyio
async def test_events_that_arrive_apart_leave_one_by_one() -> None:
    async def paced() -> AsyncIterator[bytes]:
        for event in _events(3):
            yield event
            await anyio.sleep(0.01)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=paced())

    releases, messages = _Releases(), []

    async def send(message: Message) -> None:
        messages.append(message)

    await _app(handler, releases)(_scope(), _receiver(True, anyio.Event()), send)
    bodies = [m["body"] for m in messages if m["type"] == "http.response.body" and m["body"]]
    assert bodies == _events(3)


@pytest.mark.anyio
async def test_a_stalled_client_stops_the_reading_of_the_engine_stream() -> None:
    produced = 0

    async def endless() -> AsyncIterator[bytes]:
        nonlocal produced
        event = _events(1, size=4000)[0]
        while True:
            produced += len(event)
            yield event
            await anyio.lowlevel.checkpoint()

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=endless())

    releases, disconnect, stalled = _Releases(), anyio.Event(), anyio.Event()

    async def send(message: Message) -> None:
        if message["type"] == "http.response.body":
            stalled.set()
            await anyio.sleep_forever()  # a client that stopped reading

    async with anyio.create_task_group() as tg:
        tg.start_soon(_app(handler, releases), _scope(), _receiver(True, disconnect), send)
        await stalled.wait()
        await anyio.sleep(0.3)
        held = produced
        await anyio.sleep(0.3)
        assert produced == held  # the reader waits instead of buffering without end
        assert held < 4 * 1024 * 1024
        disconnect.set()
    assert releases.count == 1


@pytest.mark.anyio
async def test_client_disconnect_closes_the_engine_stream_and_releases_once() -> None:
    closed = anyio.Event()

    async def slow() -> AsyncIterator[bytes]:
        try:
            for event in _events(1000):
                yield event
                await anyio.sleep(0.01)
        finally:
            closed.set()

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=slow())

    releases, disconnect = _Releases(), anyio.Event()
    writes = 0

    async def send(message: Message) -> None:
        nonlocal writes
        if message["type"] == "http.response.body":
            writes += 1
            if writes == 3:
                disconnect.set()

    with anyio.fail_after(10):
        await _app(handler, releases)(_scope(), _receiver(True, disconnect), send)
        await closed.wait()
    assert writes < 1000
    assert releases.count == 1


@pytest.mark.anyio
async def test_a_stream_stops_reading_the_engine_once_done_is_relayed() -> None:
    read_past_done = False

    async def engine_body() -> AsyncIterator[bytes]:
        nonlocal read_past_done
        yield _events(1)[0]
        yield b"data: [DONE]\n\n"
        read_past_done = True  # the engine's end of body, were it asked for

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=engine_body())

    releases, messages = _Releases(), []

    async def send(message: Message) -> None:
        messages.append(message)

    await _app(handler, releases)(_scope(), _receiver(True, anyio.Event()), send)
    body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")
    assert body == _events(1)[0] + b"data: [DONE]\n\n"
    assert not read_past_done
    assert releases.count == 1


@pytest.mark.anyio
async def test_the_worker_closes_a_streams_engine_connection_first() -> None:
    """Over real sockets: the engine keeps the connection open after the stream; the worker
    closes it (not pooled, and the engine's port is left without a TIME_WAIT)."""
    client_closed = anyio.Event()
    requests = 0

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal requests
        head = await reader.readuntil(b"\r\n\r\n")
        length = re.search(rb"content-length: *(\d+)", head.lower())
        await reader.readexactly(int(length.group(1)) if length else 0)
        requests += 1
        event = b"data: [DONE]\n\n"
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n" + b"%x\r\n%b\r\n0\r\n\r\n" % (len(event), event)
        )
        await writer.drain()
        if not await reader.read(1):  # EOF while we keep the connection open
            client_closed.set()
        writer.close()

    server = await asyncio.start_server(engine, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    body = json.dumps({"model": "org/m", "prompt": "x", "stream": True}).encode()
    releases, sent = _Releases(), []
    async with httpx.AsyncClient() as client:

        async def endpoint(request: Request) -> Response:
            lease = Lease("org/m", f"http://127.0.0.1:{port}", 5.0, releases)
            return await forward(
                client, lease, "/v1/completions", body, {}, stream=True, request_id="r"
            )

        app = Starlette(routes=[Route("/v1/completions", endpoint, methods=["POST"])])

        async def send(message: Message) -> None:
            sent.append(message)

        with anyio.fail_after(10):
            await app(_scope(), _receiver(True, anyio.Event()), send)
            await client_closed.wait()
    server.close()
    await server.wait_closed()
    assert requests == 1
    assert releases.count == 1
