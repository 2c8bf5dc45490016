"""The in-process servers that router tests put behind real sockets clean up after a failure.

A test that fails inside ``serve`` must not leave uvicorn's listening socket open: it
would be closed by the garbage collector during some later test, whose unclosed-socket
warning (an error under ``filterwarnings = error``) fails that unrelated test.
"""

from __future__ import annotations

import socket

import anyio
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from tests.support.asgi_server import TcpFront, serve

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _app() -> Starlette:
    return Starlette(routes=[Route("/", lambda request: PlainTextResponse("hi"))])


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


async def test_a_failing_body_still_closes_the_listening_socket() -> None:
    ports: list[int] = []

    async def fail_while_serving() -> None:
        async with serve(_app(), lifespan="off") as port:
            ports.append(port)
            assert _listening(port)
            raise KeyError("the test failed here")

    with pytest.raises(ExceptionGroup) as failure:  # raised through serve's task group
        await fail_while_serving()
    assert failure.group_contains(KeyError, match="the test failed here")
    assert not _listening(ports[0])


async def test_closing_a_hung_front_ends_its_relays_without_cancelling_them() -> None:
    async with serve(_app(), lifespan="off") as backend:
        front = TcpFront(backend)
        port = await front.start()
        stream = await anyio.connect_tcp("127.0.0.1", port)
        front.hang()
        await stream.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        with anyio.fail_after(10):
            while not front._tasks:  # noqa: ASYNC110 - the relay task is the front's own
                await anyio.sleep(0.01)
        tasks = set(front._tasks)
        await front.close()
        await stream.aclose()
    assert all(t.done() and not t.cancelled() for t in tasks)
    assert not _listening(port)
