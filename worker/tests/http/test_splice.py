"""``relay_body``: an upstream's streamed body to a real uvicorn client socket, as every hop
relays it, read back off the socket segment by segment."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import anyio
import pytest
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send
from tests.support.asgi_server import serve
from tests.support.proxy_app import EVERY_LOOP
from tests.support.scripted_engine import EngineRequest, Reply, scripted_engine

from sie_worker.http.splice import relay_body
from sie_worker.http.upstream import open_stream
from sie_worker.http.wire import WiredStarlette

pytestmark = EVERY_LOOP
_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def _upstream(first_read: anyio.Event) -> Callable[[EngineRequest], Reply]:
    """One event on its own, then (once the client has read it) the last one and the end of
    the body in a single write."""

    def reply(request: EngineRequest) -> Reply:
        async def body() -> AsyncIterator[object]:
            yield b"8\r\nevent 1\n\r\n"
            await first_read.wait()
            yield b"5\r\nlast\n\r\n0\r\n\r\n"

        return Reply(body=body(), chunked=False, head=_HEAD)

    return reply


class _Relay(Response):
    def __init__(self, url: str, transform: bool) -> None:
        self.status_code, self.background = 200, None
        self.init_headers({"content-type": "text/event-stream"})
        self._url, self._transform = url, transform

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        upstream = await open_stream(
            self._url, b"", [], method="GET", connect_timeout_s=5, high_water=1 << 20
        )
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        rest = await relay_body(upstream, scope, send, bytes.upper if self._transform else None)
        await send({"type": "http.response.body", "body": rest + b"end\n", "more_body": False})


async def _segments(port: int, first: bytes, first_read: anyio.Event) -> list[bytes]:
    """Every read of one answer's bytes off the client's socket, head included; sets
    ``first_read`` once ``first`` has arrived."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /relay HTTP/1.1\r\nHost: t\r\n\r\n")
    segments: list[bytes] = []
    try:
        with anyio.fail_after(10):
            while not b"".join(segments).endswith(b"0\r\n\r\n"):
                segment = await reader.read(65536)
                if not segment:  # the server hung up before the end of the answer
                    break
                segments.append(segment)
                if first in b"".join(segments):
                    first_read.set()
    finally:
        writer.close()
    return segments


@pytest.mark.parametrize("transform", [False, True], ids=["as-is", "transformed"])
@pytest.mark.anyio
async def test_the_bytes_read_with_the_upstreams_end_leave_with_the_answers_end(
    transform: bool,
) -> None:
    first, last = (b"EVENT 1\n", b"LAST\n") if transform else (b"event 1\n", b"last\n")
    first_read = anyio.Event()
    async with scripted_engine(_upstream(first_read)) as upstream:

        async def endpoint(request: Request) -> Response:
            return _Relay(upstream.base_url + "/stream", transform)

        app = WiredStarlette(routes=[Route("/relay", endpoint)])
        async with serve(app, lifespan="off") as port:
            segments = await _segments(port, first, first_read)
    # The first event left on its own, from the upstream parser's callback...
    assert any(s.endswith(b"8\r\n" + first + b"\r\n") for s in segments[:-1])
    # ...and the last one, the caller's bytes and the end of the answer in one write.
    assert segments[-1] == b"9\r\n" + last + b"end\n\r\n0\r\n\r\n"
