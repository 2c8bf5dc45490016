"""``upstream``: one request on its own connection, against a scripted server on a real socket."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio
import httpx
import pytest
from tests.support.proxy_app import EVERY_LOOP
from tests.support.scripted_engine import HANG, Reply, answer_with, scripted_engine

from sie_worker.http.connections import Connections
from sie_worker.http.upstream import open_stream
from sie_worker.http.upstream_answer import UpstreamAnswer

pytestmark = EVERY_LOOP
_TIMEOUTS = {"connect_timeout_s": 5.0, "read_timeout_s": 5.0, "high_water": 1 << 20}


async def _open(
    url: str,
    body: bytes = b"",
    headers: Sequence[tuple[str, str]] = (),
    **options: Any,
) -> UpstreamAnswer:
    """``open_stream`` with generous timeouts unless ``options`` say otherwise."""
    return await open_stream(url, body, headers, **{**_TIMEOUTS, **options})


@pytest.mark.anyio
async def test_the_request_line_headers_and_body_reach_the_server() -> None:
    script = answer_with(b'{"ok": true}', headers={"content-type": "application/json"})
    async with scripted_engine(script) as server:
        response = await _open(
            server.base_url + "/v1/models/a/load?slot=2",
            b'{"x": 1}',
            [("content-type", "application/json"), ("x-evil", "a\r\nInjected: 1")],
        )
        body = await response.read_all(1 << 20)
        response.close()
        seen = server.requests[0]
    assert (response.status, body) == (200, b'{"ok": true}')
    assert ("content-type", "application/json") in response.headers
    assert (seen.method, seen.path, seen.body) == ("POST", "/v1/models/a/load?slot=2", b'{"x": 1}')
    assert seen.headers["content-length"] == "8"
    assert "x-evil" not in seen.headers  # a value that would split the request is dropped
    assert "injected" not in seen.headers


@pytest.mark.anyio
async def test_a_get_without_a_body_sends_no_content_length() -> None:
    async with scripted_engine(answer_with(b"[]")) as server:
        response = await _open(server.base_url + "/v1/models", method="GET")
        assert await response.read_all(1 << 20) == b"[]"
        response.close()
        assert server.requests[0].method == "GET"
        assert "content-length" not in server.requests[0].headers


@pytest.mark.anyio
async def test_the_answer_to_head_ends_with_its_head() -> None:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n"
    async with scripted_engine(answer_with(HANG, head=head)) as server:
        with anyio.fail_after(5):
            response = await _open(server.base_url + "/v1/models", method="HEAD")
            assert await response.read_all(1 << 20) == b""
        response.close()
    assert response.status == 200
    assert response.error is None


@pytest.mark.anyio
async def test_a_silent_server_is_a_read_timeout_and_a_closed_port_a_connect_error() -> None:
    async with scripted_engine(answer_with(HANG, head=b"")) as server:
        with anyio.fail_after(5), pytest.raises(httpx.ReadTimeout):
            await _open(server.base_url + "/v1/completions", b"{}", read_timeout_s=0.2)
        url = server.base_url
    with pytest.raises(httpx.ConnectError):  # the server is gone: nothing listens there
        await _open(url + "/v1/completions", b"{}")


@pytest.mark.anyio
async def test_on_connected_says_when_the_request_is_about_to_be_written() -> None:
    calls: list[int] = []
    async with scripted_engine(answer_with(b"[]")) as server:

        def connected() -> None:
            calls.append(len(server.requests))  # nothing has reached the server yet

        response = await _open(server.base_url + "/v1/models", on_connected=connected)
        response.close()
        url = server.base_url
    assert calls == [0]
    with pytest.raises(httpx.ConnectError):  # refused: the request was never written
        await _open(url + "/v1/models", on_connected=connected)
    assert calls == [0]


@pytest.mark.anyio
async def test_only_http_urls_are_streamed() -> None:
    with pytest.raises(httpx.UnsupportedProtocol):
        await _open("https://127.0.0.1:1/x")


# -- kept-alive connections ------------------------------------------------------------------


async def _read(response: UpstreamAnswer) -> bytes:
    body = await response.read_all(1 << 20)
    response.close()
    return body


@pytest.mark.anyio
async def test_an_answer_that_ended_cleanly_leaves_its_connection_for_the_next_request() -> None:
    connections = Connections()
    async with scripted_engine(answer_with(b"a", b"b")) as server:
        for _ in range(3):
            response = await _open(server.base_url + "/v1/x", b"{}", connections=connections)
            assert await _read(response) == b"ab"
            assert connections.idle() == 1
        assert server.connections == 1
        assert len(server.requests) == 3
        assert response.reused
        connections.close()
        with anyio.fail_after(5):
            await server.client_closed.wait()  # closed from this side
    assert connections.idle() == 0


@pytest.mark.anyio
async def test_a_stream_stopped_at_its_last_event_is_read_to_its_end_and_kept() -> None:
    connections = Connections()
    done = b"data: [DONE]\n\n"

    def stop(chunk: bytes, previous: bytes) -> bool:
        return chunk.endswith(done)

    async def body() -> Any:
        yield b"data: 1\n\n"
        yield done
        await anyio.sleep(0.05)  # the end of the body comes a moment after [DONE]

    def script(request: Any) -> Any:
        from tests.support.scripted_engine import Reply

        return Reply(body=body())

    async with scripted_engine(script) as server:
        for _ in range(2):
            response = await _open(
                server.base_url + "/v1/x", b"{}", connections=connections, stop_after=stop
            )
            assert await _read(response) == b"data: 1\n\n" + done
            with anyio.fail_after(5):
                while connections.idle() == 0:  # noqa: ASYNC110 - the drain has no event
                    await anyio.sleep(0.01)
        assert server.connections == 1
        connections.close()


@pytest.mark.anyio
async def test_a_connection_the_upstream_closed_while_idle_is_not_reused() -> None:
    connections = Connections()
    async with scripted_engine(answer_with(b"a")) as server:
        response = await _open(server.base_url + "/v1/x", b"{}", connections=connections)
        assert await _read(response) == b"a"
        assert connections.idle() == 1
    # The engine has stopped (its connections were reset) and another one serves now.
    async with scripted_engine(answer_with(b"b")) as again:
        with anyio.fail_after(5):
            while connections.idle():  # noqa: ASYNC110 - the close is seen by the idle protocol
                await anyio.sleep(0.01)
        response = await _open(again.base_url + "/v1/x", b"{}", connections=connections)
        assert await _read(response) == b"b"
    connections.close()


@pytest.mark.anyio
async def test_a_get_on_a_connection_closed_as_it_was_sent_goes_again_on_a_new_one() -> None:
    connections = Connections()
    async with scripted_engine(answer_with(b"a"), keep_alive=False) as server:
        first = await _open(server.base_url + "/v1/x", connections=connections, method="GET")
        assert await _read(first) == b"a"
        second = await _open(server.base_url + "/v1/x", connections=connections, method="GET")
        assert await _read(second) == b"a"
        assert server.connections == 2  # the second request was sent again, on its own
        assert len(server.requests) == 2
        assert not second.reused
    connections.close()


@pytest.mark.anyio
async def test_a_post_on_a_connection_closed_as_it_was_sent_is_never_sent_twice() -> None:
    # RFC 9112 (9.3.1): the upstream may have acted on it; the caller answers with the error.
    connections = Connections()
    async with scripted_engine(answer_with(b"a"), keep_alive=False) as server:
        first = await _open(server.base_url + "/v1/x", b"{}", connections=connections)
        assert await _read(first) == b"a"
        assert connections.idle() == 1  # the server closes it only when the next one comes
        with pytest.raises(httpx.RemoteProtocolError):
            await _open(server.base_url + "/v1/x", b"{}", connections=connections)
        assert server.connections == 1
        assert len(server.requests) == 1
    connections.close()


@pytest.mark.anyio
async def test_idle_connections_are_closed_after_idle_s_and_at_most_max_idle_are_kept() -> None:
    connections = Connections(idle_s=0.1, max_idle=1)
    async with scripted_engine(answer_with(b"a")) as server:
        both = [
            await _open(server.base_url + "/v1/x", b"{}", connections=connections) for _ in range(2)
        ]
        for response in both:
            assert await _read(response) == b"a"
        assert connections.idle() == 1  # the second one back was closed
        with anyio.fail_after(5):
            while connections.idle():  # noqa: ASYNC110 - closed by its timer
                await anyio.sleep(0.02)
            await server.client_closed.wait()


@pytest.mark.anyio
async def test_no_connection_is_kept_after_connection_close_a_cut_body_or_head() -> None:
    connections = Connections()
    closing = answer_with(b"a", headers={"content-type": "text/plain", "connection": "close"})
    async with scripted_engine(closing) as server:
        assert await _read(await _open(server.base_url, b"{}", connections=connections)) == b"a"
        assert connections.idle() == 0
    async with scripted_engine(answer_with(b"a", HANG)) as server:
        response = await _open(server.base_url, b"{}", connections=connections)
        assert await response.take() == b"a"
        response.close()  # the caller stopped mid-body
        with anyio.fail_after(5):
            await server.client_closed.wait()
        assert connections.idle() == 0
    head = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"
    async with scripted_engine(answer_with(head=head, chunked=False)) as server:
        response = await _open(server.base_url, method="HEAD", connections=connections)
        assert await _read(response) == b""
        assert connections.idle() == 0  # an answer to HEAD may say a length it does not send


@pytest.mark.anyio
async def test_closed_connections_keep_nothing() -> None:
    connections = Connections()
    connections.close()
    async with scripted_engine(answer_with(b"a")) as server:
        assert await _read(await _open(server.base_url, b"{}", connections=connections)) == b"a"
        assert connections.idle() == 0
        with anyio.fail_after(5):
            await server.client_closed.wait()


@pytest.mark.anyio
async def test_a_spliced_answers_last_bytes_wait_for_rest_and_the_others_go_to_the_sink() -> None:
    head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    read_first = anyio.Event()

    async def body() -> Any:
        yield b"2\r\nab\r\n"
        await read_first.wait()
        yield b"2\r\ncd\r\n0\r\n\r\n"  # the last bytes and the end in one write

    async with scripted_engine(lambda request: Reply(body=body(), chunked=False, head=head)) as s:
        response = await _open(s.base_url + "/v1/x", b"{}")
        sunk: list[bytes] = []

        def sink(data: bytes) -> bool:
            sunk.append(data)
            read_first.set()
            return False

        response.splice(sink)
        with anyio.fail_after(5):
            while not response.finished:
                await response.wait()
        assert (sunk, response.rest(), response.rest()) == ([b"ab"], b"cd", b"")
        response.close()


# --- interim answers, and heads and chunk framing at the byte level ------------------------


@pytest.mark.anyio
async def test_interim_answers_are_read_past_and_the_final_head_is_returned() -> None:
    head = (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 103 Early Hints\r\nlink: </style.css>\r\n\r\n"
        b"HTTP/1.1 201 Created\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    connections = Connections()
    async with scripted_engine(answer_with(b"ok", head=head)) as server:
        response = await _open(server.base_url + "/v1/x", b"{}", connections=connections)
        assert await _read(response) == b"ok"
        assert response.status == 201
        assert response.headers == [
            ("content-type", "text/plain"),
            ("transfer-encoding", "chunked"),
        ]
        assert connections.idle() == 1  # the final answer framed the connection cleanly
    connections.close()
