"""The proxy, served through a tiny ASGI app, against a scripted engine on a real socket:
JSON answers and streams, through the same client and the engine's kept-alive connections."""

from __future__ import annotations

import itertools
import json
import socket
from typing import Any

import anyio
import httpx
import pytest
from starlette.applications import Starlette
from tests.support.proxy_app import BOTH_PATHS, EVERY_LOOP, Releases, client_of, proxy_app
from tests.support.scripted_engine import DROP, HANG, answer_with, scripted_engine

from sie_worker.http.connections import Connections
from sie_worker.worker.events import EventCheck

pytestmark = EVERY_LOOP


async def _post(app: Starlette, stream: bool = False, over: str = "asgi") -> httpx.Response:
    async with client_of(app, over) as client:
        return await client.post(
            "/v1/completions", json={"model": "org/m", "prompt": "x", "stream": stream}
        )


def _json(status: int, body: object) -> Any:
    """A script: one JSON (or raw bytes) answer with ``status``, Content-Length framed."""
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    head = (
        f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n"
        f"content-length: {len(content)}\r\n\r\n"
    ).encode()
    return answer_with(content, head=head, chunked=False)


@pytest.mark.anyio
async def test_json_answer_is_relayed_with_the_request_id() -> None:
    releases = Releases()
    async with scripted_engine(_json(200, {"choices": [{"text": "hi"}]})) as engine:
        response = await _post(proxy_app(engine.base_url, releases))
        seen = engine.requests[0].headers
    assert response.status_code == 200
    assert response.json() == {"choices": [{"text": "hi"}]}
    assert response.headers["x-request-id"] == "rid-1"
    assert seen["x-request-id"] == "rid-1"
    assert "authorization" not in seen
    assert releases.count == 1


@pytest.mark.anyio
async def test_json_answers_reuse_the_engine_s_kept_alive_connection() -> None:
    releases = Releases()
    connections = Connections(idle_s=5.0)
    script = answer_with(b'{"choices": []}', headers={"content-type": "application/json"})
    async with scripted_engine(script) as engine:
        app = proxy_app(engine.base_url, releases, connections=connections)
        for _ in range(3):
            assert (await _post(app)).status_code == 200
        assert engine.connections == 1
    connections.close()
    assert releases.count == 3


@pytest.mark.parametrize(
    ("status", "body", "expected_status", "code"),
    [
        (400, {"error": {"message": "bad max_tokens"}}, 400, "invalid_request"),
        (404, {"object": "error", "message": "no such route"}, 404, "invalid_request"),
        (413, {"detail": "too big"}, 413, "payload_too_large"),
        (500, {"error": "boom"}, 502, "engine_unavailable"),
        (503, b"<html>oops</html>", 502, "engine_unavailable"),
    ],
)
@pytest.mark.anyio
async def test_engine_errors_become_design_errors(
    status: int, body: object, expected_status: int, code: str
) -> None:
    releases = Releases()
    async with scripted_engine(_json(status, body)) as engine:
        response = await _post(proxy_app(engine.base_url, releases))
    assert response.status_code == expected_status
    assert response.json()["error"]["code"] == code
    assert response.json()["error"]["message"].startswith("org/m: ")
    assert releases.count == 1


@pytest.mark.anyio
async def test_malformed_json_from_the_engine_is_a_clean_502() -> None:
    releases = Releases()
    async with scripted_engine(_json(200, b"{not json")) as engine:
        response = await _post(proxy_app(engine.base_url, releases))
    assert response.status_code == 502
    assert "not JSON" in response.json()["error"]["message"]
    assert releases.count == 1


def _closed_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


_FAULTS = {
    "silent": answer_with(HANG, headers={"content-type": "application/json"}),
    "dropped mid-body": answer_with(b'{"choi', DROP),
    "malformed head": answer_with(head=b"HTTP/1.1 2x0 OK\r\n\r\n", chunked=False),
}


@pytest.mark.parametrize(
    ("fault", "status", "code"),
    [
        ("silent", 504, "engine_timeout"),
        ("refused", 502, "engine_unavailable"),
        ("dropped mid-body", 502, "engine_unavailable"),
        ("malformed head", 502, "engine_unavailable"),
    ],
)
@pytest.mark.anyio
async def test_transport_failures_are_translated(fault: str, status: int, code: str) -> None:
    releases = Releases()
    if fault == "refused":
        response = await _post(proxy_app(_closed_port(), releases, read_timeout=0.3))
    else:
        async with scripted_engine(_FAULTS[fault]) as engine:
            app = proxy_app(engine.base_url, releases, read_timeout=0.3)
            with anyio.fail_after(10):
                response = await _post(app)
    assert response.status_code == status
    assert response.json()["error"]["code"] == code
    assert releases.count == 1


def _error_event(text: str) -> dict[str, Any]:
    last = [e for e in text.split("\n\n") if e.strip()][-1]
    error: dict[str, Any] = json.loads(last.removeprefix("data: "))["error"]
    return error


@BOTH_PATHS
@pytest.mark.anyio
async def test_stream_relays_whole_events_even_when_split_across_chunks(over: str) -> None:
    script = answer_with(b'data: {"a"', b': 1}\n\ndata: {"b": 2}\n', b"\ndata: [DONE]\n\n")
    releases = Releases()
    async with scripted_engine(script) as engine:
        response = await _post(proxy_app(engine.base_url, releases), stream=True, over=over)
        assert engine.requests[0].headers["x-request-id"] == "rid-1"
        assert json.loads(engine.requests[0].body)["stream"] is True
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["x-request-id"] == "rid-1"
    assert response.text == 'data: {"a": 1}\n\ndata: {"b": 2}\n\ndata: [DONE]\n\n'
    assert releases.count == 1


@BOTH_PATHS
@pytest.mark.anyio
async def test_a_body_that_ends_with_the_connection_is_relayed_whole(over: str) -> None:
    events = b'data: {"a": 1}\n\ndata: [DONE]\n\n'
    releases = Releases()
    async with scripted_engine(answer_with(events[:9], events[9:], chunked=False)) as engine:
        response = await _post(proxy_app(engine.base_url, releases), stream=True, over=over)
    assert response.text == events.decode()
    assert releases.count == 1


@BOTH_PATHS
@pytest.mark.anyio
async def test_read_cap_mid_stream_ends_with_one_error_event_at_an_event_boundary(
    over: str,
) -> None:
    releases = Releases()
    async with scripted_engine(answer_with(b'data: {"n": 1}\n\ndata: {"partial', HANG)) as engine:
        app = proxy_app(engine.base_url, releases, read_timeout=0.3)
        with anyio.fail_after(10):
            response = await _post(app, stream=True, over=over)
            await engine.client_closed.wait()  # the stalled connection was closed
    events = [e for e in response.text.split("\n\n") if e.strip()]
    assert events[0] == 'data: {"n": 1}'
    error = _error_event(response.text)
    assert error["code"] == "engine_timeout"
    assert "request_read_timeout_s=0.3s" in error["message"]
    assert releases.count == 1


@BOTH_PATHS
@pytest.mark.anyio
async def test_no_answer_within_the_read_cap_is_a_504_before_the_stream_starts(over: str) -> None:
    releases = Releases()
    async with scripted_engine(answer_with(HANG, head=b"")) as engine:
        app = proxy_app(engine.base_url, releases, read_timeout=0.3)
        with anyio.fail_after(10):
            response = await _post(app, stream=True, over=over)
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "engine_timeout"
    assert releases.count == 1


@BOTH_PATHS
@pytest.mark.anyio
async def test_an_engine_that_drops_the_connection_mid_stream_ends_it_with_an_error_event(
    over: str,
) -> None:
    releases = Releases()
    async with scripted_engine(answer_with(b'data: {"n": 1}\n\n', DROP)) as engine:
        response = await _post(proxy_app(engine.base_url, releases), stream=True, over=over)
    assert response.text.startswith('data: {"n": 1}\n\n')
    error = _error_event(response.text)
    assert error["code"] == "engine_unavailable"
    assert "closed the connection" in error["message"]
    assert releases.count == 1


@pytest.mark.parametrize(
    ("status", "body", "expected_status", "code"),
    [
        (400, b'{"error": {"message": "bad max_tokens"}}', 400, "invalid_request"),
        (503, b"<html>oops</html>", 502, "engine_unavailable"),
    ],
)
@BOTH_PATHS
@pytest.mark.anyio
async def test_a_stream_the_engine_refuses_gets_the_engines_error(
    status: int, body: bytes, expected_status: int, code: str, over: str
) -> None:
    releases = Releases()
    script = answer_with(body, status=status, headers={"content-type": "application/json"})
    async with scripted_engine(script) as engine:
        response = await _post(proxy_app(engine.base_url, releases), stream=True, over=over)
    assert response.status_code == expected_status
    assert response.json()["error"]["code"] == code
    assert response.json()["error"]["message"].startswith("org/m: ")
    assert releases.count == 1


@pytest.mark.parametrize(
    "head",
    [b"SPDY/9 200 OK\r\n\r\n", b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n"],
    ids=["not-http", "huge-head"],
)
@BOTH_PATHS
@pytest.mark.anyio
async def test_an_answer_that_is_not_http_is_a_clean_502(head: bytes, over: str) -> None:
    releases = Releases()
    async with scripted_engine(answer_with(HANG, head=head)) as engine:
        with anyio.fail_after(10):
            response = await _post(proxy_app(engine.base_url, releases), stream=True, over=over)
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "engine_unavailable"
    assert releases.count == 1


@BOTH_PATHS
@pytest.mark.anyio
async def test_a_stream_to_an_engine_that_is_not_listening_is_a_502(over: str) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, never listening: connections are refused
        releases = Releases()
        response = await _post(
            proxy_app(f"http://127.0.0.1:{port}", releases), stream=True, over=over
        )
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "engine_unavailable"
    assert releases.count == 1


@pytest.mark.parametrize(
    ("script", "status"),
    [
        (answer_with(b'data: {"n": 1}\n\n', b"data: [DONE]\n\n"), "200"),
        (answer_with(b'data: {"n": 1}\n\n', DROP), "200"),  # failed after the answer began
        (answer_with(b"{}", status=400, headers={"content-type": "application/json"}), "400"),
        (answer_with(HANG, head=b""), "504"),
    ],
    ids=["done", "dropped-mid-stream", "refused", "silent"],
)
@BOTH_PATHS
@pytest.mark.anyio
async def test_a_stream_s_lease_records_the_status_the_client_got(
    script: Any, status: str, over: str
) -> None:
    releases = Releases()
    async with scripted_engine(script) as engine:
        app = proxy_app(engine.base_url, releases, read_timeout=0.3)
        with anyio.fail_after(10):
            await _post(app, stream=True, over=over)
    assert releases.statuses == [status]


@pytest.mark.parametrize(
    ("chunks", "what"),
    [
        ((b"this is not sse\n\n",), "not server-sent events"),
        ((b'data: {"n": 1}\n\n', b"data: trailing"), "truncated"),
        ((b"data: {broken\n\n",), "not JSON"),
    ],
)
@BOTH_PATHS
@pytest.mark.anyio
async def test_malformed_streams_end_with_an_error_event(
    chunks: tuple[bytes, ...], what: str, over: str
) -> None:
    releases = Releases()
    async with scripted_engine(answer_with(*chunks)) as engine:
        response = await _post(proxy_app(engine.base_url, releases), stream=True, over=over)
    error = _error_event(response.text)
    assert error["code"] == "engine_unavailable"
    assert what in error["message"]
    assert releases.count == 1


def _pieces(body: bytes, cuts: list[int]) -> list[bytes]:
    edges = [0, *cuts, len(body)]
    return [body[a:b] for a, b in itertools.pairwise(edges) if b > a]


async def _relayed(pieces: list[bytes]) -> bytes:
    """What the client gets of a stream whose reads split the body into ``pieces``."""
    stopped: list[bool] = []
    check = EventCheck("org/m")
    check.stop = lambda: stopped.append(True)
    relayed = b"".join(check.feed(piece) for piece in pieces) + check.end(None)
    assert stopped == ([True] if check.failed else [])  # a stream the check refuses is stopped
    return relayed


_EIGHT_MIB = 8 * 1024 * 1024
_NEXT = b'data: {"n": 2}\n\ndata: [DONE]\n\n'


def _event(size: int) -> bytes:
    """One SSE event whose text (without the blank line after it) is ``size`` bytes."""
    head, tail = b'data: {"pad": "', b'"}'
    return head + b"x" * (size - len(head) - len(tail)) + tail + b"\n\n"


@pytest.mark.parametrize(
    "cuts",
    [
        [],  # the oversized event and the next one in a single read
        [_EIGHT_MIB - 4096],  # the read that crosses 8 MiB also ends the event
        [_EIGHT_MIB + 10],  # ends the event and starts the next in one read
        list(range(1 << 20, _EIGHT_MIB + 1, 1 << 20)),  # 1 MiB reads, as the client reads
    ],
    ids=["one-read", "crossing-read-ends-it", "next-event-in-same-read", "mib-reads"],
)
@pytest.mark.anyio
async def test_an_event_over_8_mib_ends_the_stream_wherever_the_reads_split_it(
    cuts: list[int],
) -> None:
    body = _event(_EIGHT_MIB + 1) + _NEXT
    relayed = await _relayed(_pieces(body, cuts))
    error = _error_event(relayed.decode())
    assert error["code"] == "engine_unavailable"
    assert "larger than 8 MiB" in error["message"]
    assert b"[DONE]" not in relayed  # nothing after the oversized event is relayed


@pytest.mark.anyio
async def test_an_event_of_exactly_8_mib_is_relayed() -> None:
    body = _event(_EIGHT_MIB) + _NEXT
    relayed = await _relayed(_pieces(body, [_EIGHT_MIB - 4096]))
    assert relayed == body
