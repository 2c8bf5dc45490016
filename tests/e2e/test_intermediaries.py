"""Every hop is a correct HTTP/1.1 intermediary (gateway -> slot router -> worker -> fake
engine, every one a real process on 127.0.0.1), seen from a real client (curl):

- ``Expect: 100-continue``: the hop the client talks to answers ``100 Continue`` once and
  the request is answered once, with its whole 1.1 MB body reaching the engine (no later
  hop sees ``Expect``);
- hop-by-hop headers (RFC 9110 7.6.1) and every header ``Connection`` names stop at the
  first hop, and the client's request id reaches the engine (which end-to-end headers each
  relay passes on is in ``worker/tests/router/test_stream.py``);
- a request head above 64 KiB gets 431 ``headers_too_large`` from whichever hop it reaches;
- a malformed chunked body gets a JSON 400 ``invalid_request`` and a closed connection,
  and a body cut short by the client reaches no engine and leaves nothing in flight (raw
  sockets, at every hop).
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support import loopback
from tests.support.gateway_fixtures import GatewayProcess, PodProcess
from tests.support.relay_chain import MODEL, Chain, start_chain
from tests.support.worker_fixtures import wait_until

pytestmark = pytest.mark.slow

CURL = shutil.which("curl")


@pytest.fixture
def chain(
    start_pod: Callable[..., PodProcess], start_gateway: Callable[..., GatewayProcess]
) -> Chain:
    return start_chain(start_pod, start_gateway)


def _curl(url: str, body: Path, *headers: str) -> tuple[list[str], dict[str, object]]:
    """POST ``body`` with curl; the status lines it saw, in order, and the answer's JSON."""
    assert CURL is not None, "curl is needed (it ships with the CI image)"
    argv = [CURL, "-sS", "-v", "--max-time", "60", "-H", "Content-Type: application/json"]
    for header in headers:
        argv += ["-H", header]
    done = subprocess.run(
        [*argv, "--data-binary", f"@{body}", url],
        capture_output=True,
        text=True,
        timeout=90,
        check=True,
    )
    statuses = re.findall(r"^< (HTTP/1\.1 \d{3}[^\r\n]*)", done.stderr, flags=re.M)
    answer: dict[str, object] = json.loads(done.stdout)
    return [s.strip() for s in statuses], answer


def test_expect_100_continue_is_answered_once_and_the_whole_body_reaches_the_engine(
    chain: Chain, tmp_path: Path
) -> None:
    # 1000 words of 1.1 kB each: 1.1 MB of prompt in fewer tokens than the context holds.
    words = 1000
    prompt = " ".join(f"w{i:04d}" + "x" * 1100 for i in range(words))
    body = tmp_path / "body.json"
    body.write_text(json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 3}))
    assert body.stat().st_size > 1_000_000
    before = chain.engine()["requests"]
    statuses, answer = _curl(chain.gateway.url + "/v1/completions", body, "Expect: 100-continue")
    assert statuses == ["HTTP/1.1 100 Continue", "HTTP/1.1 200 OK"], answer
    assert answer["usage"]["prompt_tokens"] == words  # type: ignore[index]
    text = answer["choices"][0]["text"]  # type: ignore[index]
    assert [w[:5] for w in text.split()] == ["w0000", "w0001", "w0002"]
    engine = chain.engine()
    assert engine["requests"] == before + 1
    assert "expect" not in engine["last_header_names"]


def test_hop_by_hop_headers_never_reach_the_engine_and_the_request_id_does(
    chain: Chain, tmp_path: Path
) -> None:
    body = tmp_path / "body.json"
    body.write_text(json.dumps({"model": MODEL, "prompt": "a b c", "max_tokens": 2}))
    statuses, answer = _curl(
        chain.gateway.url + "/v1/completions",
        body,
        "Connection: keep-alive, X-Trace-Hop",
        "X-Trace-Hop: gateway-only",
        "Keep-Alive: timeout=5",
        "TE: trailers",
        "Proxy-Authorization: Basic dXNlcjpwYXNz",
        "X-Tenant: team-a",
        "X-Request-Id: hop-1",
    )
    assert statuses == ["HTTP/1.1 200 OK"], answer
    engine = chain.engine()
    seen = set(engine["last_header_names"])
    assert {"x-request-id", "content-type"} <= seen
    assert not seen & {"x-trace-hop", "keep-alive", "te", "proxy-authorization", "expect"}
    assert engine["recent_request_ids"][-1] == "hop-1"


@pytest.mark.parametrize("hop", ["gateway", "router", "worker"])
def test_a_request_head_above_64_kib_is_431_at_every_hop(chain: Chain, hop: str) -> None:
    url = {"gateway": chain.gateway.url, "router": chain.pod.url, "worker": chain.worker_url}
    before = chain.engine()["requests"]
    answer = loopback.post(
        url[hop] + "/v1/completions",
        json={"model": MODEL, "prompt": "a", "max_tokens": 1},
        headers={"X-Big": "x" * (65 * 1024)},
        timeout=30,
    )
    assert answer.status_code == 431, answer.text
    assert answer.json()["error"]["code"] == "headers_too_large"
    # Just below the limit goes through.
    fits = loopback.post(
        url[hop] + "/v1/completions",
        json={"model": MODEL, "prompt": "a", "max_tokens": 1},
        headers={"X-Big": "x" * (60 * 1024)},
        timeout=30,
    )
    assert fits.status_code == 200, fits.text
    assert chain.engine()["requests"] == before + 1


def _raw(port: int, data: bytes, *, close_write: bool = False) -> bytes:
    """Send ``data`` on a new connection; everything read until the server closes it."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(data)
        if close_write:
            sock.shutdown(socket.SHUT_WR)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return received


def _port(chain: Chain, hop: str) -> int:
    url = {"gateway": chain.gateway.url, "router": chain.pod.url, "worker": chain.worker_url}
    return int(url[hop].rsplit(":", 1)[1])


_HEAD = (
    b"POST /v1/completions HTTP/1.1\r\nHost: sie\r\nContent-Type: application/json\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)


@pytest.mark.parametrize("hop", ["gateway", "router", "worker"])
def test_a_malformed_chunked_body_is_a_json_400_and_the_connection_closed(
    chain: Chain, hop: str
) -> None:
    before = chain.engine()["requests"]
    received = _raw(_port(chain, hop), _HEAD + b"zz\r\n{}\r\n0\r\n\r\n")  # until closed
    assert received.startswith(b"HTTP/1.1 400 "), received[:200]
    error = json.loads(received.partition(b"\r\n\r\n")[2])["error"]
    assert error["code"] == "invalid_request"
    assert chain.engine()["requests"] == before


@pytest.mark.parametrize("hop", ["gateway", "router", "worker"])
def test_a_body_cut_short_reaches_no_engine_and_leaves_nothing_in_flight(
    chain: Chain, hop: str
) -> None:
    before = chain.engine()["requests"]
    body = json.dumps({"model": MODEL, "prompt": "a b", "max_tokens": 2}).encode()
    # The chunk promises more than comes, and the client closes its side.
    _raw(_port(chain, hop), _HEAD + b"%x\r\n" % (len(body) + 50) + body, close_write=True)
    wait_until(lambda: all(v == 0 for v in chain.inflight().values()), timeout=30)
    assert chain.engine()["requests"] == before
    # The hop still serves.
    fits = loopback.post(
        f"http://127.0.0.1:{_port(chain, hop)}/v1/completions",
        content=body,
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    assert fits.status_code == 200, fits.text
