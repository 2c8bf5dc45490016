"""Engine faults with real processes and signals; each test ends with the shared end-state check.

What the worker does (also reported in the issue note):

- engine SIGKILLed mid-stream: the stream ends with one ``engine_unavailable`` SSE event, the
  model turns ``failed`` with the exit code, its block and its rank processes are released;
  the next request loads it again;
- engine SIGSTOPped (a hang): every request fails with ``engine_timeout`` once the read cap
  passes; the model stays ``ready`` on the same engine (the cap never restarts an engine, seed
  000); after SIGCONT the same engine serves again. A stopped engine is indistinguishable from
  a slow one, so nothing else happens until an operator unloads it;
- engine slow to start, not even listening, past ``startup_timeout_s``: ``startup_timeout``
  504, the engine (and one that ignores SIGTERM) is stopped and its block released;
- engine exits at start, before or after listening: ``load_failed`` 502 naming the code;
- engine port taken on every try: ``load_failed`` after three ports, nothing left; the next
  request loads it.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.reliability._support import (
    Launcher,
    Worker,
    assert_clean,
    complete,
    engine_of,
    error_of,
    sigcont_quietly,
    stream_events,
)
from tests.support.port_squatter import kill_squatters, squatter_prefix, squatters
from tests.support.worker_fixtures import fake_model, wait_until

_RANKS = {"FAKE_ENGINE_CHILDREN": "2"}


@pytest.fixture(scope="module")
def worker(module_launcher: Launcher) -> Worker:
    configs = [
        fake_model("org/ok"),
        fake_model(
            "org/tp2",
            width=2,
            request_read_timeout_s=2,
            env={**_RANKS, "FAKE_ENGINE_TOKEN_DELAY_S": "0.05"},
        ),
        fake_model(
            "org/listen-late",
            startup_timeout_s=1.5,
            env={**_RANKS, "FAKE_ENGINE_LISTEN_LATE": "1", "FAKE_ENGINE_START_DELAY_S": "120"},
        ),
        fake_model(
            "org/deaf-hang",
            startup_timeout_s=1,
            env={**_RANKS, "FAKE_ENGINE_NEVER_READY": "1", "FAKE_ENGINE_IGNORE_SIGTERM": "1"},
        ),
        fake_model("org/exit-early", env={**_RANKS, "FAKE_ENGINE_EXIT_AT_START": "3"}),
        fake_model(
            "org/exit-late",
            env={**_RANKS, "FAKE_ENGINE_EXIT_AT_START": "7", "FAKE_ENGINE_START_DELAY_S": "0.3"},
        ),
    ]
    return module_launcher.start(configs, env={"SIE_ENGINE_STOP_GRACE_S": "2"})


def _load(worker: Worker, model: str) -> Any:
    with worker.client() as client:
        return client.post(f"/v1/models/{model}/load")


def _alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_engine_sigkilled_mid_stream_ends_the_stream_with_one_error_and_frees_its_block(
    worker: Worker,
) -> None:
    assert _load(worker, "org/tp2").status_code == 200
    engine = engine_of(worker, "org/tp2")
    ranks = engine.children()
    assert len(ranks) == 2

    def kill_after_two(index: int, payload: str) -> None:
        if index == 2:
            os.kill(engine.pid, signal.SIGKILL)

    status, events = stream_events(worker, "org/tp2", on_event=kill_after_two, tokens=200)
    assert status == 200
    errors = [error_of(e) for e in events if error_of(e)]
    assert len(errors) == 1, events
    assert error_of(events[-1]) == errors[0]
    assert errors[0]["code"] == "engine_unavailable"
    assert "[DONE]" not in events
    wait_until(lambda: worker.models()["org/tp2"]["state"] == "failed")
    model = worker.models()["org/tp2"]
    assert "exited unexpectedly with code -9" in model["error"]
    wait_until(lambda: not any(_alive(r) for r in ranks))  # orphaned ranks are killed too
    assert_clean(worker, probe="org/tp2")  # loads it again


def test_engine_sigstopped_fails_requests_at_the_read_cap_without_restart_and_serves_after_sigcont(
    worker: Worker,
) -> None:
    assert _load(worker, "org/tp2").status_code == 200
    engine = engine_of(worker, "org/tp2")

    def stop_after_one(index: int, payload: str) -> None:
        if index == 1:
            os.kill(engine.pid, signal.SIGSTOP)

    try:
        started = time.monotonic()
        status, events = stream_events(worker, "org/tp2", on_event=stop_after_one, tokens=200)
        streamed_s = time.monotonic() - started
        assert status == 200
        error = error_of(events[-1])
        assert error is not None
        assert error["code"] == "engine_timeout"
        assert "request_read_timeout_s=2" in error["message"]
        assert "[DONE]" not in events
        hung = complete(worker, "org/tp2")
        assert hung.status_code == 504
        assert hung.json()["error"]["code"] == "engine_timeout"
        assert engine.status() == psutil.STATUS_STOPPED
        model = worker.models()["org/tp2"]
        assert model["state"] == "ready"  # the cap fails requests, it does not restart engines
        assert model["inflight"] == 0
        assert worker.engines()["org/tp2"] == engine.pid
    finally:
        sigcont_quietly(engine.pid)
    assert streamed_s < 30  # bounded by the 2 s cap, not by the 10 s stream (no hang)
    assert complete(worker, "org/tp2").status_code == 200
    status, events = stream_events(worker, "org/tp2", tokens=3)
    assert events[-1] == "[DONE]"
    assert worker.engines()["org/tp2"] == engine.pid  # the same engine, never restarted
    assert_clean(worker, probe="org/ok")


@pytest.mark.parametrize("model", ["org/listen-late", "org/deaf-hang"])
def test_engine_slow_to_start_past_startup_timeout_is_stopped_and_its_block_released(
    worker: Worker, model: str
) -> None:
    response = _load(worker, model)
    assert response.status_code == 504
    error = response.json()["error"]
    assert error["code"] == "startup_timeout"
    assert "startup_timeout_s=" in error["message"]
    entry = worker.models()[model]
    assert entry["state"] == "failed"
    assert entry["devices"] == []
    assert_clean(worker, probe="org/ok")


@pytest.mark.parametrize(("model", "code"), [("org/exit-early", 3), ("org/exit-late", 7)])
def test_engine_exiting_at_start_fails_the_load_and_leaves_nothing(
    worker: Worker, model: str, code: int
) -> None:
    response = _load(worker, model)
    assert response.status_code == 502
    error = response.json()["error"]
    assert error["code"] == "load_failed"
    assert f"code {code}" in error["message"]
    assert "simulated startup failure" in error["message"]  # the engine's last output
    assert worker.models()[model]["state"] == "failed"
    assert_clean(worker, probe="org/ok")


def test_engine_port_taken_on_every_try_fails_the_load_then_the_next_request_loads(
    launcher: Launcher, fake_engine_minimal_command: str, tmp_path: Path
) -> None:
    state = tmp_path / "squatters"
    worker = launcher.start(
        [fake_model("org/ok", env=_RANKS)],
        devices="cuda:0",
        env={"SIE_SGLANG_COMMAND": f"{squatter_prefix(state, 3)} {fake_engine_minimal_command}"},
    )
    try:
        failed = _load(worker, "org/ok")
        assert failed.status_code == 502
        error = failed.json()["error"]
        assert error["code"] == "load_failed"
        assert "already in use" in error["message"]
        assert "3 ports tried" in error["message"]
        assert len(squatters(state)) == 3
        assert worker.models()["org/ok"]["state"] == "failed"
        assert_clean(worker, probe="org/ok")  # the fourth launch gets its port
    finally:
        kill_squatters(state)
