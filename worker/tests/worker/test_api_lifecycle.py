"""Model lifecycle through the real API: crashes, timeouts, streams, drains, signals."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil
from tests.support.port_squatter import kill_squatters, squatter_prefix, squatters
from tests.support.worker_fixtures import WorkerProcess, fake_model, wait_until

StartWorker = Callable[..., WorkerProcess]


def _stream(
    client: httpx.Client, model: str, started: threading.Event | None = None, **fake: object
) -> tuple[int, list[str]]:
    """Stream a completion; ``started`` is set once its first event arrived."""
    body = {"model": model, "prompt": "hello", "max_tokens": 8, "stream": True}
    if fake:
        body["fake"] = fake
    events: list[str] = []
    with client.stream("POST", "/v1/completions", json=body) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(line[len("data: ") :])
                if started is not None:
                    started.set()
        return response.status_code, events


def test_stream_is_relayed_event_by_event(start_worker: StartWorker) -> None:
    worker = start_worker([fake_model("org/m")], devices="cuda:0")
    with worker.client() as client:
        status, events = _stream(client, "org/m", tokens=5)
    assert status == 200
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert len(chunks) >= 5
    assert all(c["object"] == "text_completion" for c in chunks)


def test_request_id_reaches_the_engine_and_comes_back(start_worker: StartWorker) -> None:
    worker = start_worker([fake_model("org/m")], devices="cuda:0")
    with worker.client() as client:
        response = client.post(
            "/v1/completions",
            json={"model": "org/m", "prompt": "x", "max_tokens": 1},
            headers={"X-Request-Id": "req-123"},
        )
    assert response.status_code == 200
    assert response.headers["x-request-id"] == "req-123"


def test_the_access_log_keeps_requests_and_leaves_out_successful_polls_and_probes(
    start_worker: StartWorker,
) -> None:
    worker = start_worker([fake_model("org/m")], devices="cuda:0")  # polls /healthz until up
    with worker.client() as client:
        for path in ("/readyz", "/v1/models", "/v1/devices", "/metrics"):
            assert client.get(path).status_code == 200
        assert client.get("/v1/models/org/nope").status_code == 404
        assert _stream(client, "org/m", tokens=2)[0] == 200
    assert worker.stop() == 0
    logged = [line.split('"')[1] for line in worker.logs().splitlines() if "uvicorn.access" in line]
    assert logged == ["GET /v1/models/org/nope HTTP/1.1", "POST /v1/completions HTTP/1.1"]


def test_stalled_stream_on_a_width_2_model_fails_within_its_read_cap_and_engine_keeps_serving(
    start_worker: StartWorker,
) -> None:
    worker = start_worker(
        [fake_model("org/tp2", width=2, request_read_timeout_s=1, startup_timeout_s=30)],
        devices="cuda:0,cuda:1",
    )
    with worker.client() as client:
        client.post("/v1/models/org/tp2/load").raise_for_status()
        pids_before = worker.engine_pids()
        started = time.monotonic()
        status, events = _stream(client, "org/tp2", stall_after=2, tokens=10)
        elapsed = time.monotonic() - started
        assert status == 200
        error = json.loads(events[-1])["error"]
        assert error["code"] == "engine_timeout"
        assert elapsed < 20  # bounded by the 1 s cap, not by the stall
        # The next request to the same model succeeds on the same engine: no restart.
        again = client.post(
            "/v1/completions", json={"model": "org/tp2", "prompt": "x", "max_tokens": 2}
        )
        assert again.status_code == 200
        assert worker.engine_pids() == pids_before
        assert worker.models()["org/tp2"]["state"] == "ready"


def test_read_cap_before_the_first_byte_is_a_504(start_worker: StartWorker) -> None:
    worker = start_worker([fake_model("org/m", request_read_timeout_s=0.5)], devices="cuda:0")
    with worker.client() as client:
        response = client.post(
            "/v1/completions",
            json={"model": "org/m", "prompt": "x", "max_tokens": 1, "fake": {"delay_s": 5}},
        )
        assert response.status_code == 504
        assert response.json()["error"]["code"] == "engine_timeout"
        assert worker.models()["org/m"]["state"] == "ready"


def test_engine_killed_mid_stream_fails_the_request_and_releases_the_devices(
    start_worker: StartWorker,
) -> None:
    worker = start_worker(
        [fake_model("org/m", width=2, request_read_timeout_s=10)], devices="cuda:0,cuda:1"
    )
    with worker.client() as client:
        client.post("/v1/models/org/m/load").raise_for_status()
        status, events = _stream(client, "org/m", die_after=2, tokens=10)
        assert status == 200
        assert json.loads(events[-1])["error"]["code"] == "engine_unavailable"
        wait_until(lambda: worker.models()["org/m"]["state"] == "failed")
        model = worker.models()["org/m"]
        assert model["devices"] == []
        assert "exited" in model["error"]
        assert all(m is None for m in worker.devices().values())
        # The next request loads it again.
        again = client.post(
            "/v1/completions", json={"model": "org/m", "prompt": "x", "max_tokens": 1}
        )
        assert again.status_code == 200
        assert worker.models()["org/m"]["state"] == "ready"


def test_engine_sigkilled_outside_a_request_marks_the_model_failed(
    start_worker: StartWorker,
) -> None:
    worker = start_worker([fake_model("org/m")], devices="cuda:0")
    with worker.client() as client:
        client.post("/v1/models/org/m/load").raise_for_status()
    for pid in worker.engine_pids():
        os.kill(pid, signal.SIGKILL)
    wait_until(lambda: worker.models()["org/m"]["state"] == "failed")
    assert worker.devices() == {"cuda:0": None}
    wait_until(lambda: worker.engine_pids() == [])


def test_engine_slow_to_start_past_startup_timeout_is_stopped(start_worker: StartWorker) -> None:
    worker = start_worker(
        [fake_model("org/slow", startup_timeout_s=1, env={"FAKE_ENGINE_NEVER_READY": "1"})],
        devices="cuda:0",
    )
    with worker.client() as client:
        response = client.post("/v1/models/org/slow/load")
    assert response.status_code == 504
    error = response.json()["error"]
    assert error["code"] == "startup_timeout"
    assert "startup_timeout_s=1" in error["message"]
    assert worker.devices() == {"cuda:0": None}
    assert worker.models()["org/slow"]["state"] == "failed"
    wait_until(lambda: worker.engine_pids() == [])


def test_engine_port_taken_is_retried_on_another_port(
    start_worker: StartWorker, fake_engine_minimal_command: str, tmp_path: Path
) -> None:
    # The port passes the worker's bind test, then is taken before the engine binds it.
    state = tmp_path / "squatters"
    command = f"{squatter_prefix(state, 1)} {fake_engine_minimal_command}"
    worker = start_worker(
        [fake_model("org/m")], devices="cuda:0", env={"SIE_SGLANG_COMMAND": command}
    )
    try:
        with worker.client() as client:
            response = client.post("/v1/models/org/m/load")
        assert response.status_code == 200, response.text
        assert response.json()["state"] == "ready"
        assert len(squatters(state)) == 1
        assert "already in use" in worker.logs().lower()
    finally:
        kill_squatters(state)


def test_prefer_wait_zero_answers_503_with_retry_after_while_loading(
    start_worker: StartWorker,
) -> None:
    worker = start_worker(
        [fake_model("org/slow", env={"FAKE_ENGINE_START_DELAY_S": "2"})], devices="cuda:0"
    )
    with worker.client() as client:
        response = client.post(
            "/v1/completions",
            json={"model": "org/slow", "prompt": "x", "max_tokens": 1},
            headers={"Prefer": "wait=0"},
        )
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "model_loading"
        assert int(response.headers["retry-after"]) > 0
        wait_until(lambda: worker.models()["org/slow"]["state"] == "ready")


def test_unload_releases_devices_and_stops_the_engine(start_worker: StartWorker) -> None:
    worker = start_worker([fake_model("org/m", width=2)], devices="cuda:0,cuda:1")
    with worker.client() as client:
        client.post("/v1/models/org/m/load").raise_for_status()
        pids = worker.engine_pids()
        assert pids
        entry = client.post("/v1/models/org/m/unload").json()
    assert entry["state"] == "unloaded"
    assert entry["devices"] == []
    assert all(
        not psutil.pid_exists(p) or psutil.Process(p).status() == psutil.STATUS_ZOMBIE for p in pids
    )


def test_unknown_model_is_404(start_worker: StartWorker) -> None:
    worker = start_worker([], devices="cuda:0")
    with worker.client() as client:
        response = client.post("/v1/completions", json={"model": "nope", "prompt": "x"})
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "unknown_model"
        assert client.post("/v1/models/no/such:thing/load").status_code == 404


def test_model_ids_with_slashes_and_profiles_route_to_model_actions(
    start_worker: StartWorker,
) -> None:
    config = fake_model("org/deep/name", profiles={"fast": {"extends": "default"}})
    worker = start_worker([config], devices="cuda:0,cuda:1")
    with worker.client() as client:
        assert (
            client.post("/v1/models/org/deep/name:fast/load").json()["id"] == "org/deep/name:fast"
        )
        detail = client.get("/v1/models/org/deep/name:fast").json()
        assert (detail["id"], detail["worker_state"]) == ("org/deep/name:fast", "ready")
        assert detail["state"] == "loaded"  # SIE's word, as sie-sdk's get_model reads it


def test_sigterm_lets_streams_in_flight_finish_then_stops_engines_and_exits_0(
    start_worker: StartWorker,
) -> None:
    worker = start_worker(
        [fake_model("org/m", env={"FAKE_ENGINE_TOKEN_DELAY_S": "0.05"})], devices="cuda:0"
    )
    with worker.client() as client:
        client.post("/v1/models/org/m/load").raise_for_status()
    result: dict[str, object] = {}
    under_way = threading.Event()

    def consume() -> None:
        with worker.client() as client:
            result["stream"] = _stream(client, "org/m", under_way, tokens=40)

    thread = threading.Thread(target=consume)
    thread.start()
    # The first event came: the stream is in flight (40 tokens x 50 ms), not merely sent.
    assert under_way.wait(timeout=60), "the stream never started"
    engines = worker.engine_pids()
    code = worker.stop(signal.SIGTERM)
    thread.join(timeout=30)
    assert code == 0
    status, events = result["stream"]  # type: ignore[misc]
    assert status == 200
    assert events[-1] == "[DONE]"
    assert not worker.surviving_engines()
    assert engines


def test_worker_sigkill_leaves_no_engine_behind(start_worker: StartWorker) -> None:
    worker = start_worker(
        [fake_model("org/a"), fake_model("org/b", width=2)], devices="cuda:0,cuda:1,cuda:2"
    )
    with worker.client() as client:
        client.post("/v1/models/org/a/load").raise_for_status()
        client.post("/v1/models/org/b/load").raise_for_status()
    engines = worker.engine_pids()
    assert len(engines) >= 2
    worker.stop(signal.SIGKILL)
    assert worker.surviving_engines() == []


def test_a_pinned_model_whose_engine_dies_is_loaded_again(start_worker: StartWorker) -> None:
    worker = start_worker(
        [fake_model("org/p", width=2)], devices="cuda:0,cuda:1", env={"SIE_PINNED_MODELS": "org/p"}
    )
    wait_until(lambda: worker.models()["org/p"]["state"] == "ready")
    first = worker.engine_pids()
    for pid in first:
        os.kill(pid, signal.SIGKILL)
    # Waited on until the reload is seen whole (new engines, ready again): the state's short
    # spell away from ready could fall between two polls of a busy machine.
    wait_until(
        lambda: (
            bool(engines := worker.engine_pids())
            and set(engines).isdisjoint(first)
            and worker.models()["org/p"]["state"] == "ready"
        ),
        timeout=60,
    )
    assert worker.models()["org/p"]["pinned"] is True
    assert set(worker.engine_pids()).isdisjoint(first)
    assert worker.devices() == {"cuda:0": "org/p", "cuda:1": "org/p"}
