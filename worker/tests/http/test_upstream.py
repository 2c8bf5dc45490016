"""``upstream``: one request on its own connection, against a scripted server on a real socket."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio
import httpx
import pytest
from tests.support.proxy_app import EVERY_LOOP
from tests.support.scripted_engine import HANG, answer_with, scripted_engine

from sie_worker.http.upstream import StreamResponse, open_stream

pytestmark = EVERY_LOOP
_TIMEOUTS = {"connect_timeout_s": 5.0, "read_timeout_s": 5.0, "high_water": 1 << 20}


async def _open(
    url: str,
    body: bytes = b"",
    headers: Sequence[tuple[str, str]] = (),
    **options: Any,
) -> StreamResponse:
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
