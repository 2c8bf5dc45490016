"""The streaming relay's hot path: coalesced writes, backpressure, disconnects, connections.

The proxy is driven through raw ASGI calls so that each ``http.response.body`` message (one
socket write in uvicorn) can be counted, against a scripted engine on a real socket
(``tests/support/scripted_engine.py``).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import pytest
from tests.support.proxy_app import EVERY_LOOP, Releases, proxy_app
from tests.support.scripted_engine import EngineRequest, Reply, scripted_engine

from sie_worker.http.connections import Connections
from sie_worker.worker.metrics import StreamTimer

Message = dict[str, Any]
DONE = b"data: [DONE]\n\n"

pytestmark = EVERY_LOOP


def _script(body: Callable[[], AsyncIterator[object]]) -> Callable[[EngineRequest], Reply]:
    return lambda request: Reply(body=body())


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


async def _stream(base_url: str, releases: Releases, send: Callable[[Message], Any]) -> None:
    """One streaming request through the proxy, by a client that never disconnects."""
    await proxy_app(base_url, releases)(_scope(), _receiver(True, anyio.Event()), send)


def _events(n: int, size: int = 0) -> list[bytes]:
    pad = "x" * size
    return [f'data: {{"n": {i}, "pad": "{pad}"}}\n\n'.encode() for i in range(n)]


def _bodies(messages: list[Message]) -> list[bytes]:
    return [m["body"] for m in messages if m["type"] == "http.response.body" and m["body"]]


@pytest.mark.anyio
async def test_events_that_arrive_together_leave_in_one_write() -> None:
    async def burst() -> AsyncIterator[object]:
        yield [*_events(5), DONE]  # six chunks in one socket write

    releases, messages = Releases(), []

    async def send(message: Message) -> None:
        messages.append(message)

    async with scripted_engine(_script(burst)) as engine:
        await _stream(engine.base_url, releases, send)
    assert _bodies(messages) == [b"".join([*_events(5), DONE])]
    assert releases.count == 1


@pytest.mark.anyio
async def test_events_that_arrive_apart_leave_one_by_one() -> None:
    async def paced() -> AsyncIterator[object]:
        for event in _events(3):
            yield event
            await anyio.sleep(0.05)

    releases, messages = Releases(), []

    async def send(message: Message) -> None:
        messages.append(message)

    async with scripted_engine(_script(paced)) as engine:
        await _stream(engine.base_url, releases, send)
    assert _bodies(messages) == _events(3)


@pytest.mark.anyio
async def test_a_stalled_client_stops_the_reading_of_the_engine_stream() -> None:
    async def endless() -> AsyncIterator[object]:
        event = _events(1, size=4000)[0]
        while True:
            yield event

    releases, disconnect, stalled = Releases(), anyio.Event(), anyio.Event()

    async def send(message: Message) -> None:
        if message["type"] == "http.response.body":
            stalled.set()
            await anyio.sleep_forever()  # a client that stopped reading

    async with scripted_engine(_script(endless), send_buffer=64 * 1024) as engine:
        async with anyio.create_task_group() as tg:
            app = proxy_app(engine.base_url, releases)
            tg.start_soon(app, _scope(), _receiver(True, disconnect), send)
            await stalled.wait()
            # The relay stops reading past 1 MiB, the kernel's buffers fill, the engine's
            # writes block: bounded, instead of buffering without end.
            held = -1
            with anyio.fail_after(20):  # however slow the machine, it comes to rest
                while engine.produced != held:
                    held = engine.produced
                    await anyio.sleep(0.3)
            assert held < 16 * 1024 * 1024
            await anyio.sleep(0.3)
            assert engine.produced == held
            disconnect.set()
        with anyio.fail_after(10):
            await engine.client_closed.wait()
    assert releases.count == 1


@pytest.mark.anyio
async def test_client_disconnect_closes_the_engine_stream_and_releases_once() -> None:
    async def slow() -> AsyncIterator[object]:
        for event in _events(1000):
            yield event
            await anyio.sleep(0.01)

    releases, disconnect = Releases(), anyio.Event()
    writes = 0

    async def send(message: Message) -> None:
        nonlocal writes
        if message["type"] == "http.response.body":
            writes += 1
            if writes == 3:
                disconnect.set()

    async with scripted_engine(_script(slow)) as engine:
        with anyio.fail_after(10):
            app = proxy_app(engine.base_url, releases)
            await app(_scope(), _receiver(True, disconnect), send)
            await engine.client_closed.wait()
    assert writes < 1000
    assert releases.count == 1


@pytest.mark.anyio
async def test_a_stream_stops_reading_the_engine_once_done_is_relayed() -> None:
    late = b'data: {"late": true}\n\n'

    async def engine_body() -> AsyncIterator[object]:
        yield _events(1)[0]
        yield DONE
        await anyio.sleep(0.2)
        yield late  # past [DONE]: must never reach the client

    releases, messages = Releases(), []

    async def send(message: Message) -> None:
        messages.append(message)

    async with scripted_engine(_script(engine_body)) as engine:
        with anyio.fail_after(10):
            await proxy_app(engine.base_url, releases)(
                _scope(), _receiver(True, anyio.Event()), send
            )
            await engine.client_closed.wait()
    assert b"".join(_bodies(messages)) == _events(1)[0] + DONE
    assert releases.count == 1


@pytest.mark.anyio
async def test_the_worker_closes_a_streams_engine_connection_first() -> None:
    """The engine keeps the connection open after the stream; the worker closes it (never
    reused, and the engine's port is left without a TIME_WAIT)."""

    async def done_only() -> AsyncIterator[object]:
        yield DONE

    releases, sent = Releases(), []

    async def send(message: Message) -> None:
        sent.append(message)

    async with scripted_engine(_script(done_only)) as engine:
        with anyio.fail_after(10):
            await proxy_app(engine.base_url, releases)(
                _scope(), _receiver(True, anyio.Event()), send
            )
            await engine.client_closed.wait()
        assert len(engine.requests) == 1
    assert b"".join(_bodies(sent)) == DONE
    assert releases.count == 1


@pytest.mark.anyio
async def test_streams_of_a_running_engine_reuse_its_connection_closed_by_the_worker() -> None:
    """With the engine's kept-alive connections (what a running engine has), a stream's
    connection is read to the end of its body after [DONE] and serves the next stream; the
    worker closes it when the engine stops, so the TIME_WAIT is still the worker's."""

    async def one_event() -> AsyncIterator[object]:
        yield _events(1)[0]
        yield DONE

    releases, connections = Releases(), Connections()
    async with scripted_engine(_script(one_event)) as engine:
        with anyio.fail_after(10):
            for _ in range(3):
                sent: list[Message] = []
                app = proxy_app(engine.base_url, releases, connections=connections)
                await app(_scope(), _receiver(True, anyio.Event()), _append_to(sent))
                assert b"".join(_bodies(sent)) == _events(1)[0] + DONE
                while not connections.idle():  # noqa: ASYNC110 - read to its end, then kept
                    await anyio.sleep(0.01)
            assert (engine.connections, len(engine.requests)) == (1, 3)
            assert not engine.client_closed.is_set()
            connections.close()  # the engine stops
            await engine.client_closed.wait()
    assert releases.count == 3


def _append_to(messages: list[Message]) -> Callable[[Message], Any]:
    async def send(message: Message) -> None:
        messages.append(message)

    return send


class _Observed:
    def __init__(self) -> None:
        self.values: list[float] = []

    def observe(self, amount: float) -> None:
        self.values.append(amount)


@pytest.mark.anyio
async def test_each_relayed_write_is_timed_first_token_then_inter_token() -> None:
    written = [anyio.Event() for _ in range(3)]

    async def paced() -> AsyncIterator[object]:
        for index, event in enumerate(_events(3)):
            yield event
            # why: the gap starts once the relay wrote this event; a bare sleep lets a busy
            # machine deliver two events in one read, and their writes leave back to back
            await written[index].wait()
            await anyio.sleep(0.05)

    ttft, itl = _Observed(), _Observed()
    timer = StreamTimer(ttft, itl, started=time.monotonic())
    releases, messages = Releases(), []

    async def send(message: Message) -> None:
        messages.append(message)
        if 0 < (count := len(_bodies(messages))) <= len(written):
            written[count - 1].set()

    async with scripted_engine(_script(paced)) as engine:
        app = proxy_app(engine.base_url, releases, timer=timer)
        await app(_scope(), _receiver(True, anyio.Event()), send)
    assert len(_bodies(messages)) == 3
    assert len(ttft.values) == 1
    assert ttft.values[0] >= 0
    assert len(itl.values) == 2
    assert all(v >= 0.04 for v in itl.values)
