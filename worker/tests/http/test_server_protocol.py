"""The servers' HTTP/1.1 protocol (uvicorn's httptools one, with our 400): a request that does
not parse gets a JSON ``invalid_request`` and a closed connection, never a second head in
the middle of an answer already on its way. Real uvicorn, raw sockets."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import anyio
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from tests.support.asgi_server import serve

from sie_worker.http.server_protocol import http_protocol

pytestmark = pytest.mark.anyio

_ECHO_CLOSE = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
_CHUNKED = b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"


def _app(release: asyncio.Event) -> Starlette:
    """``POST /echo`` answers the body's size; ``GET /slow`` streams one event, then waits
    for ``release`` before the last."""

    async def echo(request: Request) -> Response:
        return JSONResponse({"bytes": len(await request.body())})

    async def slow(request: Request) -> Response:
        async def events() -> AsyncIterator[bytes]:
            yield b"data: 1\n\n"
            await release.wait()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[Route("/echo", echo, methods=["POST"]), Route("/slow", slow)])


async def _exchange(port: int, data: bytes, *, until: bytes | None = None) -> bytes:
    """Write ``data``; read until the server closes (or ``until`` has been read)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    received = b""
    with anyio.fail_after(10):
        while chunk := await reader.read(65536):
            received += chunk
            if until is not None and until in received:
                break
    writer.close()
    return received


def _answer(raw: bytes) -> tuple[str, dict[str, str], dict[str, object]]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    return lines[0], headers, json.loads(body)


def test_the_servers_run_the_httptools_protocol_with_our_400() -> None:
    protocol = http_protocol()
    assert not isinstance(protocol, str)
    assert protocol.__name__ == "HopHttpProtocol"


@pytest.mark.parametrize(
    "request_bytes",
    [
        _CHUNKED + b"zz\r\n{}\r\n0\r\n\r\n",
        b"NOT HTTP AT ALL\r\n\r\n",
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
        b"GET /echo HTTP/1.1\r\nBad Header\r\n\r\n",
    ],
    ids=["bad chunk size", "bad request line", "two lengths", "header without colon"],
)
async def test_a_request_that_does_not_parse_gets_a_json_400_and_a_closed_connection(
    request_bytes: bytes,
) -> None:
    async with serve(_app(asyncio.Event()), lifespan="off") as port:
        raw = await _exchange(port, request_bytes)  # returns once the server closed
        status, headers, body = _answer(raw)
        good = await _exchange(port, _ECHO_CLOSE)  # the server still serves
    assert status == "HTTP/1.1 400 Bad Request"
    assert headers["content-type"] == "application/json"
    assert headers["connection"] == "close"
    assert headers["x-sie-error-code"] == "INVALID_INPUT"
    assert body["error"]["code"] == "invalid_request"  # type: ignore[index]
    assert "not valid HTTP/1.1" in body["error"]["message"]  # type: ignore[index]
    assert good.startswith(b"HTTP/1.1 200 ")


async def test_garbage_behind_an_answer_on_its_way_closes_without_a_second_head() -> None:
    release = asyncio.Event()
    async with serve(_app(release), lifespan="off") as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        received = b""
        with anyio.fail_after(10):
            while b"data: 1" not in received:
                received += await reader.read(65536)
            writer.write(b"NOT HTTP AT ALL\r\n\r\n")
            while chunk := await reader.read(65536):
                received += chunk
        writer.close()
        release.set()
    assert received.count(b"HTTP/1.1 ") == 1  # the stream's head only: no 400 inside it
    assert b"invalid_request" not in received
