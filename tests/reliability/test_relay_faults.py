"""Slow and vanishing clients on the whole request path (gateway -> slot router -> worker ->
fake engine, every one a real process on 127.0.0.1), where each hop writes a stream's events
to its client from the upstream parser's callback.

- A client that stops reading: each hop stops reading its upstream once its client's socket
  and its own write buffer are full, so no hop's memory grows with the stream (a stream of
  hundreds of MB that every hop would hold otherwise); the engine's writes block.
- A client that leaves mid-stream, reading or not: every hop closes its upstream
  connection, the engine's request ends as abandoned, and every in-flight count (engine,
  worker, router, gateway) is back to zero.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.support import loopback
from tests.support.gateway_fixtures import GatewayProcess, PodProcess
from tests.support.relay_chain import MODEL, Chain, start_chain
from tests.support.worker_fixtures import wait_until

pytestmark = pytest.mark.slow

_MIB = 1024 * 1024


@pytest.fixture
def chain(
    start_pod: Callable[..., PodProcess], start_gateway: Callable[..., GatewayProcess]
) -> Chain:
    return start_chain(start_pod, start_gateway)


def _open_stream(chain: Chain, fake: dict[str, Any], receive_buffer: int = 4096) -> socket.socket:
    """A client socket that has sent one streaming request through the gateway."""
    body = json.dumps({"model": MODEL, "prompt": "a b c", "stream": True, "fake": fake}).encode()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.connect(("127.0.0.1", chain.gateway.port))
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    sock.sendall(head + body)
    return sock


def _all_zero(chain: Chain) -> bool:
    return all(v == 0 for v in chain.inflight().values())


def test_a_client_that_stops_reading_never_makes_a_hop_buffer_the_stream(chain: Chain) -> None:
    before = chain.rss()
    # About 2 million events of ~190 bytes: some 380 MB, far more than every socket buffer
    # on the way can hold, written by the engine as fast as it can.
    sock = _open_stream(chain, {"fast": True, "tokens": 2_000_000})
    try:
        wait_until(lambda: chain.inflight()["engine"] == 1, timeout=30)
        time.sleep(4)  # the engine would have written it all by now: nothing reads it
        grown = {k: v - before[k] for k, v in chain.rss().items()}
        assert all(v < 48 * _MIB for v in grown.values()), grown
        assert chain.inflight() == {"engine": 1, "worker": 1, "router": 1, "gateway": 1}
    finally:
        sock.close()
    # The client left without reading: every hop closes its upstream, down to the engine,
    # whose write fails long before the stream's end.
    wait_until(lambda: _all_zero(chain), timeout=30)


def test_a_client_that_leaves_mid_stream_ends_the_engine_request_at_every_hop(
    chain: Chain,
) -> None:
    cancelled = chain.engine()["cancelled"]
    sock = _open_stream(chain, {"tokens": 100_000, "token_delay_s": 0.005}, receive_buffer=65536)
    try:
        seen = b""
        deadline = time.monotonic() + 30
        # A few events have come through every hop (each its own chunk, or several in one).
        while seen.count(b"data: ") < 5:
            assert time.monotonic() < deadline, seen[-500:]
            seen += sock.recv(65536)
        assert b"HTTP/1.1 200" in seen
        assert b"transfer-encoding: chunked" in seen.lower()
    finally:
        sock.close()
    wait_until(lambda: _all_zero(chain), timeout=30)
    assert chain.engine()["cancelled"] == cancelled + 1
    # The path still serves, and its counts go back to zero again.
    with loopback.client(base_url=chain.gateway.url, timeout=60) as client:
        answer = client.post(
            "/v1/completions", json={"model": MODEL, "prompt": "x", "fake": {"tokens": 3}}
        )
    assert answer.status_code == 200, answer.text
    wait_until(lambda: _all_zero(chain), timeout=30)
