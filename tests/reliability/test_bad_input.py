"""Bad input from both sides: malformed engine output, oversized bodies, hostile model ids,
clients that leave mid-body and documents that break parsers.

What the worker does (also reported in the issue note):

- malformed engine output: a non-stream answer that is not JSON, or a 5xx, becomes
  ``engine_unavailable`` (502, DESIGN.md body); a stream with broken framing or an event
  above 8 MiB ends with one SSE error event and is closed; a large but well-formed answer
  (4 MiB event, 9 MiB body) is relayed whole. The engine stays ready, no lease leaks;
- oversized bodies get 413 ``payload_too_large`` on every endpoint, declared or chunked;
- ids with ``..``, NUL or absolute paths are refused (404 ``unknown_model`` / 400) on every
  endpoint that takes one, and nothing is written outside the config dir;
- a client that leaves before its body arrived is not logged as a worker error.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.reliability._support import (
    Launcher,
    Worker,
    assert_clean,
    complete,
    error_of,
    stream_events,
)
from tests.support.worker_fixtures import fake_model, wait_until

_LIMIT = 64 * 1024
_MIB = 1024 * 1024


@pytest.fixture(scope="module")
def worker(module_launcher: Launcher) -> Worker:
    configs = [fake_model("org/gen"), fake_model("org/emb", task="encode")]
    worker = module_launcher.start(
        configs, devices="cuda:0,cuda:1", env={"SIE_MAX_BODY_BYTES": str(_LIMIT)}
    )
    with worker.client() as client:
        client.post("/v1/models/org/gen/load").raise_for_status()
    return worker


def _idle(worker: Worker, model: str) -> bool:
    entry = worker.models()[model]
    return bool(entry["state"] == "ready" and entry["inflight"] == 0)


# --- malformed engine output -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("fake", "says"),
    [
        ({"malformed": "json"}, "not JSON"),
        ({"malformed": "sse"}, "not JSON"),  # an event stream where a JSON body belongs
        ({"malformed": "bad_status"}, "engine HTTP 500"),
    ],
)
def test_malformed_non_stream_answers_become_engine_unavailable(
    worker: Worker, fake: dict[str, Any], says: str
) -> None:
    response = complete(worker, "org/gen", **fake)
    assert response.status_code == 502
    error = response.json()["error"]
    assert error["code"] == "engine_unavailable"
    assert says in error["message"]
    wait_until(lambda: _idle(worker, "org/gen"))


@pytest.mark.parametrize(
    ("fake", "says"),
    [
        ({"malformed": "sse"}, "stream closed"),  # broken framing, then a truncated event
        ({"malformed": "huge_chunk", "huge_bytes": 9 * _MIB}, "larger than 8 MiB"),
    ],
)
def test_malformed_streams_end_with_one_error_event(
    worker: Worker, fake: dict[str, Any], says: str
) -> None:
    status, events = stream_events(worker, "org/gen", **fake)
    assert status == 200
    errors = [e for e in events if error_of(e)]
    assert errors == [events[-1]], events[-3:]
    error = error_of(events[-1])
    assert error is not None
    assert error["code"] == "engine_unavailable"
    assert says in error["message"]
    assert "[DONE]" not in events
    wait_until(lambda: _idle(worker, "org/gen"))


def test_a_stream_of_events_that_are_not_json_ends_with_one_error_event(worker: Worker) -> None:
    status, events = stream_events(worker, "org/gen", malformed="json", tokens=3)
    assert status == 200
    assert all(e == "[DONE]" or error_of(e) or json.loads(e) for e in events[:-1])
    error = error_of(events[-1])
    assert error is not None
    assert error["code"] == "engine_unavailable"


def test_a_stream_whose_engine_fails_before_streaming_gets_a_design_error(worker: Worker) -> None:
    status, _ = stream_events(worker, "org/gen", malformed="bad_status")
    assert status == 502
    wait_until(lambda: _idle(worker, "org/gen"))


def test_large_but_well_formed_engine_output_is_relayed_whole(worker: Worker) -> None:
    status, events = stream_events(worker, "org/gen", malformed="huge_chunk", tokens=2)
    assert status == 200
    assert events[-1] == "[DONE]"
    first = json.loads(events[0])["choices"][0]["text"]
    assert len(first) == 4 * _MIB
    response = complete(worker, "org/gen", malformed="huge_chunk", huge_bytes=9 * _MIB)
    assert response.status_code == 200
    assert len(response.json()["fake_padding"]) == 9 * _MIB
    assert_clean(worker, probe="org/gen")


# --- oversized bodies ------------------------------------------------------------------------

_BODY_ENDPOINTS = [
    ("POST", "/v1/completions"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/embeddings"),
    ("POST", "/v1/encode/org/emb"),
    ("POST", "/v1/score/org/emb"),
    ("POST", "/v1/generate/org__gen"),
    ("PUT", "/v1/configs/org/big"),
]


@pytest.mark.parametrize(("method", "path"), _BODY_ENDPOINTS)
def test_oversized_bodies_get_413_declared_or_chunked(
    worker: Worker, method: str, path: str
) -> None:
    big = b'{"model": "org/gen", "prompt": "' + b"x" * (_LIMIT + 10) + b'"}'

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(big), 4096):
            yield big[start : start + 4096]

    with worker.client() as client:
        for content in (big, chunks()):
            response = client.request(
                method, path, content=content, headers={"Content-Type": "application/json"}
            )
            assert response.status_code == 413, (path, response.text)
            assert response.json()["error"]["code"] == "payload_too_large"
            assert "SIE_MAX_BODY_BYTES" in response.json()["error"]["message"]
    assert "org/big" not in worker.models()


def test_a_declared_oversized_body_gets_413_even_where_no_body_is_read(worker: Worker) -> None:
    # The model actions read no body, so a chunked one is never counted (nor stored).
    with worker.client() as client:
        response = client.post("/v1/models/org/gen/load", content=b"x" * (_LIMIT + 1))
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "payload_too_large"


# --- hostile ids -----------------------------------------------------------------------------

_HOSTILE_IDS = [
    "..",
    "../../etc/passwd",
    "org/../../escape",
    "%2e%2e%2f%2e%2e%2fescape",
    "..%2Fescape",
    "org%2F..%2F..%2Fescape",
    "/etc/passwd",
    "%2Fetc%2Fpasswd",
    "org/m%00",
    "%00",
    "org/%00/../x",
]


def _raw(worker: Worker, method: str, path: str, body: bytes | None = None) -> tuple[int, Any]:
    """Send ``path`` exactly as written (no client-side normalisation of dots or slashes)."""
    connection = http.client.HTTPConnection("127.0.0.1", worker.port, timeout=30)
    try:
        headers = {"Content-Type": "application/json"}
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        connection.close()


@pytest.mark.parametrize("model_id", _HOSTILE_IDS)
def test_hostile_model_ids_are_refused_on_every_endpoint_that_takes_one(
    worker: Worker, model_id: str
) -> None:
    config = json.dumps(fake_model("org/x")).encode()
    requests = [
        ("GET", f"/v1/models/{model_id}", None),
        ("POST", f"/v1/models/{model_id}/load", None),
        ("POST", f"/v1/models/{model_id}/unload", None),
        ("POST", f"/v1/models/{model_id}/pin", None),
        ("POST", f"/v1/models/{model_id}/unpin", None),
        ("GET", f"/v1/configs/{model_id}", None),
        ("PUT", f"/v1/configs/{model_id}", config),
        ("DELETE", f"/v1/configs/{model_id}", None),
        ("POST", f"/v1/encode/{model_id}", b'{"items": [{"text": "x"}]}'),
        ("POST", f"/v1/score/{model_id}", b'{"query": {"text": "q"}, "items": [{"text": "x"}]}'),
        ("POST", f"/v1/generate/{model_id}", b'{"prompt": "x", "max_new_tokens": 1}'),
    ]
    for method, path, body in requests:
        status, payload = _raw(worker, method, path, body)
        assert status in (400, 404), (method, path, status, payload)
        assert payload["error"]["code"] in ("unknown_model", "invalid_request", "not_found")
    decoded = model_id.replace("%2e", ".").replace("%2f", "/").replace("%2F", "/")
    decoded = decoded.replace("%00", "\x00")
    for endpoint in ("/v1/completions", "/v1/chat/completions", "/v1/embeddings"):
        body = json.dumps({"model": decoded, "prompt": "x", "input": "x"}).encode()
        status, payload = _raw(worker, "POST", endpoint, body)
        assert status == 404, (endpoint, status, payload)
        assert payload["error"]["code"] == "unknown_model"
    _nothing_written_outside(worker.config_dir)


def _nothing_written_outside(config_dir: Path) -> None:
    root = config_dir.parent
    assert not list(root.rglob("escape*"))
    assert not list(root.rglob("passwd*"))
    assert sorted(p.name for p in config_dir.rglob("*")) == sorted(
        p.name for p in config_dir.glob("*.yaml")
    )


# --- clients and documents that break things -------------------------------------------------


def test_a_client_leaving_mid_body_is_not_logged_as_a_worker_error(worker: Worker) -> None:
    before = worker.logs().count("Traceback")
    for path in ("/v1/completions", "/v1/configs/org/gone"):
        with socket.create_connection(("127.0.0.1", worker.port)) as sock:
            head = f"PUT {path} HTTP/1.1\r\nHost: w\r\nContent-Type: application/json\r\n"
            if path == "/v1/completions":
                head = head.replace("PUT", "POST")
            sock.sendall(head.encode() + b'Content-Length: 1000\r\n\r\n{"model": ')
            time.sleep(0.2)  # the request is being read; then the client leaves
    wait_until(lambda: worker.logs().count("the client left before sending its body") >= 2)
    assert worker.logs().count("Traceback") == before
    assert "unexpected error" not in worker.logs()
    assert complete(worker, "org/gen").status_code == 200


@pytest.mark.parametrize("kind", ["application/json", "application/yaml"])
def test_config_bodies_that_break_parsers_are_invalid_config_not_500(
    worker: Worker, kind: str
) -> None:
    with worker.client() as client:
        for body in (b"[" * 50_000, b"{" * 30_000, b"- " * 20_000 + b"x"):
            response = client.put(
                "/v1/configs/org/deep", content=body, headers={"Content-Type": kind}
            )
            assert response.status_code == 400, response.text[:300]
            error = response.json()["error"]
            assert error["code"] == "invalid_config"
            assert "$" in error["message"]


def test_deeply_nested_openai_bodies_are_invalid_request_not_500(worker: Worker) -> None:
    # Deep enough to exhaust Python's parser, small enough to pass the body limit.
    body = b'{"model": "org/gen", "prompt": ' + b"[" * 20_000 + b"]" * 20_000 + b"}"
    assert len(body) < _LIMIT
    with worker.client() as client:
        response = client.post(
            "/v1/completions", content=body, headers={"Content-Type": "application/json"}
        )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_request"


@pytest.mark.parametrize("path", ["/v1/encode/org/emb", "/v1/generate/org__gen"])
def test_deeply_nested_sie_bodies_are_invalid_request_not_500(worker: Worker, path: str) -> None:
    nested_json = b'{"items": ' + b"[" * 20_000 + b"]" * 20_000 + b"}"
    nested_msgpack = b"\x81\xa5items" + b"\x91" * 40_000 + b"\x90"  # arrays 40000 deep
    with worker.client() as client:
        for body, content_type in (
            (nested_json, "application/json"),
            (nested_msgpack, "application/msgpack"),
        ):
            response = client.post(path, content=body, headers={"Content-Type": content_type})
            assert response.status_code == 400, (path, content_type, response.text)
            assert response.json()["error"]["code"] == "invalid_request"
            assert response.headers["x-sie-error-code"] == "INVALID_INPUT"


def _read_response(sock: socket.socket) -> bytes:
    """One whole HTTP/1.1 response (head and Content-Length body), however the reads split."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed after {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed after {data!r}"
        body += chunk
    assert len(body) == length
    return head


def test_idle_keep_alive_connections_outlive_the_usual_5_s_client_expiry(worker: Worker) -> None:
    request = b"GET /healthz HTTP/1.1\r\nHost: w\r\n\r\n"
    with socket.create_connection(("127.0.0.1", worker.port), timeout=10) as sock:
        sock.sendall(request)
        assert _read_response(sock).startswith(b"HTTP/1.1 200")
        time.sleep(5.5)  # idle a little longer than clients keep a connection by default
        sock.sendall(request)
        assert _read_response(sock).startswith(b"HTTP/1.1 200")


def test_after_all_bad_input_the_worker_is_clean(worker: Worker) -> None:
    assert_clean(worker, probe="org/gen")
