"""``transport``: httpx's client on the relays' own HTTP client, against a scripted server."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import httpx
import pytest
from tests.support.proxy_app import EVERY_LOOP
from tests.support.scripted_engine import HANG, EngineRequest, Reply, answer_with, scripted_engine

from sie_worker.http import transport
from sie_worker.http.transport import UpstreamTransport, hop_client

pytestmark = EVERY_LOOP
_JSON = {"content-type": "application/json"}


def _client(**timeouts: float) -> httpx.AsyncClient:
    return hop_client(httpx.Timeout(timeouts.pop("default", 5.0), **timeouts))


@pytest.mark.anyio
async def test_a_get_and_a_post_come_back_as_httpx_responses() -> None:
    async with scripted_engine(answer_with(b'{"ok": ', b"true}", headers=_JSON)) as server:
        async with _client() as client:
            got = await client.get(server.base_url + "/v1/models", headers={"x-a": "1"})
            posted = await client.post(server.base_url + "/v1/models/m/load?slot=1", json={"x": 1})
        seen = server.requests
    assert (got.status_code, got.json(), posted.json()) == (200, {"ok": True}, {"ok": True})
    assert got.headers["content-type"] == "application/json"
    assert "transfer-encoding" not in got.headers  # the body is whole: no framing left
    assert str(got.request.url) == server.base_url + "/v1/models"
    assert (seen[0].method, seen[0].path, seen[0].headers["x-a"]) == ("GET", "/v1/models", "1")
    assert (seen[1].method, seen[1].path, seen[1].body) == (
        "POST",
        "/v1/models/m/load?slot=1",
        b'{"x":1}',
    )
    assert seen[1].headers["content-length"] == "7"


@pytest.mark.anyio
async def test_calls_in_a_row_share_one_kept_alive_connection_until_the_client_closes() -> None:
    async with scripted_engine(answer_with(b"{}", headers=_JSON)) as server:
        client = _client()
        for _ in range(4):
            assert (await client.get(server.base_url + "/readyz")).status_code == 200
        assert server.connections == 1
        await client.aclose()
        with anyio.fail_after(5):
            await server.client_closed.wait()  # the idle connection is closed with the client


@pytest.mark.anyio
async def test_errors_are_httpx_errors_that_name_their_request() -> None:
    async with scripted_engine(answer_with(HANG, head=b"")) as server:
        async with _client(read=0.2) as client:
            with anyio.fail_after(5), pytest.raises(httpx.ReadTimeout) as timed_out:
                await client.get(server.base_url + "/v1/models")
        url = server.base_url
    assert timed_out.value.request.url.path == "/v1/models"
    async with _client() as client:
        with pytest.raises(httpx.ConnectError) as refused:  # nothing listens there any more
            await client.get(url + "/readyz")
    assert refused.value.request.url.path == "/readyz"


@pytest.mark.anyio
async def test_an_answer_over_the_limit_fails_rather_than_arriving_cut(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(transport, "MAX_ANSWER_BYTES", 8)
    async with (
        scripted_engine(answer_with(b"0123456789", headers=_JSON)) as server,
        _client() as client,
    ):
        with pytest.raises(httpx.RemoteProtocolError, match="larger than 8 bytes"):
            await client.get(server.base_url + "/v1/models")
        monkeypatch.setattr(transport, "MAX_ANSWER_BYTES", 10)
        assert (await client.get(server.base_url + "/v1/models")).content == b"0123456789"


@pytest.mark.anyio
async def test_https_goes_through_httpx_default_transport(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[httpx.URL] = []

    async def default(self: httpx.AsyncHTTPTransport, request: httpx.Request) -> httpx.Response:
        sent.append(request.url)
        return httpx.Response(204)

    monkeypatch.setattr(httpx.AsyncHTTPTransport, "handle_async_request", default)
    async with httpx.AsyncClient(transport=UpstreamTransport()) as client:
        answer = await client.get("https://pod.example:8443/v1/models")
    assert (answer.status_code, sent) == (204, [httpx.URL("https://pod.example:8443/v1/models")])


@pytest.mark.anyio
async def test_a_large_answer_whose_head_comes_alone_is_read_whole() -> None:
    # An answer of 64 KiB and more waits after its head for a relay to take it around the
    # parser; a call that reads it whole must read on all the same.
    body = bytes(range(256)) * 400

    def script(request: EngineRequest) -> Reply:
        async def later() -> AsyncIterator[object]:
            await anyio.sleep(0.2)  # the head arrives in a read of its own
            yield body

        head = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n"
        return Reply(
            body=later(), chunked=False, head=head + b"content-length: %d\r\n\r\n" % len(body)
        )

    async with scripted_engine(script) as server, _client(read=2) as client:
        with anyio.fail_after(5):
            got = await client.get(server.base_url + "/metrics")
    assert got.content == body
