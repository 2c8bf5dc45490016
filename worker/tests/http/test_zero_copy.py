"""A large body with a length, moved from the upstream socket to the client's in the kernel
(``splice_rest``) or read whole into one buffer (``read_body``): the same bytes, and the
relay's promises kept (a body cut short, a silent upstream, a client that leaves, the
connection given back), over real sockets and uvicorn."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable

import anyio
import httpx
import pytest
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send
from tests.support.asgi_server import serve
from tests.support.proxy_app import EVERY_LOOP
from tests.support.scripted_engine import DROP, HANG, EngineRequest, Reply, scripted_engine

from sie_worker.http import splice as splice_module
from sie_worker.http.connections import Connections
from sie_worker.http.splice import relay_body
from sie_worker.http.upstream import open_stream
from sie_worker.http.wire import WiredStarlette
from sie_worker.http.zero_copy import read_body, splice_rest

pytestmark = [EVERY_LOOP, pytest.mark.skipif(not hasattr(os, "splice"), reason="Linux only")]
_BODY = os.urandom(1024 * 1024 + 7)


def _engine(body: bytes, *then: object) -> Callable[[EngineRequest], Reply]:
    """Answers with ``body`` under a Content-Length of all of it, in 64 KiB writes (the
    first with the head), then ``then`` (HANG, DROP) in place of whatever is left."""

    def reply(request: EngineRequest) -> Reply:
        head = b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\n"
        head += b"content-length: %d\r\n\r\n" % len(_BODY)

        async def send() -> AsyncIterator[object]:
            for at in range(0, len(body), 65536):
                yield body[at : at + 65536]
            for item in then:
                yield item

        return Reply(body=send(), chunked=False, head=head)

    return reply


class _Relay(Response):
    """Relays the upstream's answer as the hops do, recording what ``splice_rest`` said and
    how the relay ended."""

    def __init__(self, url: str, seen: dict[str, object], connections: Connections) -> None:
        self.status_code, self.background = 200, None
        self.init_headers({"content-type": "application/octet-stream"})
        self._url, self._seen, self._connections = url, seen, connections

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        upstream = await open_stream(
            self._url,
            b"",
            [],
            method="GET",
            connect_timeout_s=5,
            read_timeout_s=0.5,
            high_water=1 << 20,
            connections=self._connections,
        )
        head = [(b"content-length", str(len(_BODY)).encode()), *self.raw_headers]
        await send({"type": "http.response.start", "status": 200, "headers": head})
        try:
            rest = await relay_body(upstream, scope, send)
        except Exception as exc:
            self._seen["error"] = exc
            raise
        finally:
            upstream.close()
        await send({"type": "http.response.body", "body": rest, "more_body": False})
        self._seen["ended"] = True  # uvicorn found the length met, or the client gone


@pytest.fixture
def spliced(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """What each ``splice_rest`` of the relay answered."""
    answers: list[object] = []

    async def recorded(*args: object) -> bool | None:
        answer = await splice_rest(*args)  # type: ignore[arg-type]
        answers.append(answer)
        return answer

    monkeypatch.setattr(splice_module, "splice_rest", recorded)
    return answers


async def _relayed(
    script: Callable[[EngineRequest], Reply], requests: int = 1
) -> tuple[list[bytes], dict[str, object], Connections]:
    """The bodies the client got for ``requests`` requests on one connection (each cut at
    the server's close), what the relay recorded, and its upstream connections."""
    seen: dict[str, object] = {}
    connections = Connections()
    async with scripted_engine(script) as engine:

        async def endpoint(request: Request) -> Response:
            return _Relay(engine.base_url + "/big", seen, connections)

        app = WiredStarlette(routes=[Route("/relay", endpoint)])
        bodies: list[bytes] = []
        async with (
            serve(app, lifespan="off") as port,
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client,
        ):
            for _ in range(requests):
                try:
                    bodies.append((await client.get("/relay")).content)
                except httpx.RemoteProtocolError:
                    bodies.append(b"")  # the server hung up before the length was met
    return bodies, seen, connections


@pytest.mark.anyio
async def test_a_large_body_with_a_length_crosses_whole_and_its_connection_is_reused(
    spliced: list[object],
) -> None:
    bodies, seen, _ = await _relayed(_engine(_BODY), requests=2)
    assert bodies == [_BODY, _BODY]
    assert spliced == [True, True]
    assert "error" not in seen


@pytest.mark.parametrize(
    ("then", "error"),
    [(DROP, httpx.ReadError), (HANG, httpx.ReadTimeout)],
    ids=["cut-short", "silent"],
)
@pytest.mark.anyio
async def test_a_body_cut_short_or_silent_mid_way_fails_and_no_client_gets_it_as_whole(
    then: object, error: type[Exception], spliced: list[object]
) -> None:
    bodies, seen, _ = await _relayed(_engine(_BODY[:300_000], then))
    assert bodies == [b""]
    assert spliced == []  # splice_rest raised: it never answered
    assert isinstance(seen["error"], error)


@pytest.mark.parametrize("behind", [False, True], ids=["reading", "not-reading"])
@pytest.mark.anyio
async def test_a_client_that_leaves_mid_body_ends_the_upstream_request(behind: bool) -> None:
    seen: dict[str, object] = {}
    # Behind: the whole body comes, and the client's socket fills while it reads nothing.
    script = _engine(_BODY, HANG) if behind else _engine(_BODY[:300_000], HANG)
    async with scripted_engine(script) as engine:

        async def endpoint(request: Request) -> Response:
            return _Relay(engine.base_url + "/big", seen, Connections())

        app = WiredStarlette(routes=[Route("/relay", endpoint)])
        async with serve(app, lifespan="off") as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /relay HTTP/1.1\r\nHost: t\r\n\r\n")
            if behind:
                writer.transport.set_write_buffer_limits(0)
                await asyncio.sleep(0.3)
            else:
                await reader.read(65536)  # the head and the first bytes
            writer.transport.abort()
            with anyio.fail_after(5):
                await engine.client_closed.wait()
                while "ended" not in seen and "error" not in seen:  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
    # Behind, the write to the gone client failed: the relay ended cleanly. Reading, it
    # waited for the upstream until its read timeout (in the hops, ClientWatch cancels it).
    assert "error" not in seen if behind else isinstance(seen["error"], httpx.ReadTimeout)


@pytest.mark.anyio
async def test_a_small_body_is_relayed_as_before(spliced: list[object]) -> None:
    small = _BODY[:1000]

    def script(request: EngineRequest) -> Reply:
        head = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(small)

        async def send() -> AsyncIterator[object]:
            yield small

        return Reply(body=send(), chunked=False, head=head)

    async with scripted_engine(script) as engine:
        upstream = await open_stream(
            engine.base_url + "/small", b"", [], method="GET", connect_timeout_s=5, high_water=1
        )
        try:
            assert await read_body(upstream, 1 << 30) is None
            assert await upstream.read_all(1 << 20) == small
        finally:
            upstream.close()


@pytest.mark.parametrize("whole", [True, False], ids=["whole", "cut-short"])
@pytest.mark.anyio
async def test_read_body_reads_a_large_body_into_one_buffer(whole: bool) -> None:
    script = _engine(_BODY) if whole else _engine(_BODY[:300_000], DROP)
    connections = Connections()
    async with scripted_engine(script) as engine:
        upstream = await open_stream(
            engine.base_url + "/big",
            b"",
            [],
            method="GET",
            connect_timeout_s=5,
            high_water=1 << 30,
            connections=connections,
        )
        try:
            if whole:
                assert await read_body(upstream, 1 << 30) == _BODY
                assert connections.idle() == 1  # whole: the connection is clean to reuse
            else:
                with pytest.raises(httpx.ReadError):
                    await read_body(upstream, 1 << 30)
        finally:
            upstream.close()
