"""A pod on one machine: 4 one-device ``sie-worker serve`` processes on fake SGLang engines
behind a real ``sie-worker route`` process, all over 127.0.0.1 sockets."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from sie_worker.http.resume import REASONS

from tests.support import loopback
from tests.support.ports import free_port
from tests.support.sie_sdk import SdkRunner
from tests.support.worker_fixtures import WorkerProcess, fake_model, wait_until

pytestmark = pytest.mark.slow

SLOTS = 4
MODELS = ("org/alpha", "org/beta", "org/gamma")


@dataclass
class Pod:
    router: subprocess.Popen[bytes]
    port: int
    workers: list[WorkerProcess]
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self) -> httpx.Client:
        return loopback.client(base_url=self.url, timeout=60.0, trust_env=False)

    def loads(self) -> int:
        """Successful model loads, counted by the workers themselves."""
        total = 0
        for worker in self.workers:
            text = loopback.get(worker.url + "/metrics", timeout=5).text
            total += _sample(text, 'sie_model_loads_total{outcome="ready"}')
        return total

    def holders(self, model: str) -> list[int]:
        """Slots whose worker has ``model`` ready."""
        return [i for i, w in enumerate(self.workers) if w.models()[model]["state"] == "ready"]

    def metric(self, name: str) -> float:
        return _sample(loopback.get(self.url + "/metrics", timeout=5).text, name)


def _sample(text: str, name: str) -> int:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return int(float(line.split()[-1]))
    return 0


@pytest.fixture
def pod(start_worker: Callable[..., WorkerProcess], tmp_path: Path) -> Iterator[Pod]:
    configs = [fake_model(m, env={"FAKE_ENGINE_START_DELAY_S": "1"}) for m in MODELS]
    # Each healthy on a port of its own before the router is given the ports (start_worker
    # starts a worker again on a new port when another process took its first one).
    workers = [start_worker(configs, devices="cuda:0") for _ in range(SLOTS)]
    port = free_port()
    log_path = tmp_path / "router.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIE_")}
    env.update(
        {
            "SIE_GPU_COUNT": str(SLOTS),
            "SIE_WORKER_PORTS": ",".join(str(w.port) for w in workers),
            "SIE_ROUTER_POLL_INTERVAL_S": "0.2",
            "SIE_ROUTER_POLL_TIMEOUT_S": "1",
        }
    )
    argv = [sys.executable, "-m", "sie_worker", "route", "--host", "127.0.0.1"]
    argv += ["--port", str(port)]
    with log_path.open("wb") as log:
        router = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    pod = Pod(router, port, workers, log_path)
    try:
        wait_until(lambda: _ready(pod), timeout=90)
        yield pod
    finally:
        for worker in workers:  # a stopped worker cannot be shut down
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.process.pid, signal.SIGCONT)
        router.send_signal(signal.SIGTERM)
        try:
            assert router.wait(timeout=30) == 0, log_path.read_text()
        finally:
            if router.poll() is None:
                router.kill()
                router.wait()


def _ready(pod: Pod) -> bool:
    assert pod.router.poll() is None, pod.log_path.read_text()
    for worker in pod.workers:
        assert worker.process.poll() is None, worker.logs()
    try:
        body = loopback.get(pod.url + "/readyz", timeout=2).json()
    except httpx.HTTPError:
        return False
    return all(s["up"] for s in body["slots"])


def _complete(client: httpx.Client, model: str) -> httpx.Response:
    return client.post(
        "/v1/completions", json={"model": model, "prompt": "hello pod", "max_tokens": 4}
    )


def test_repeated_requests_for_one_model_load_it_once(pod: Pod) -> None:
    with pod.client() as client, ThreadPoolExecutor(8) as pool:
        burst = list(pool.map(lambda _: _complete(client, "org/alpha"), range(8)))
        later = [_complete(client, "org/alpha") for _ in range(8)]
    assert [r.status_code for r in burst + later] == [200] * 16
    assert len({r.headers["x-sie-slot"] for r in burst + later}) == 1
    assert pod.loads() == 1
    assert pod.holders("org/alpha") == [int(burst[0].headers["x-sie-slot"])]
    assert pod.metric('sie_router_decisions_total{reason="free_device"}') == 1


def test_each_model_loads_once_on_its_own_slot(pod: Pod) -> None:
    with pod.client() as client, ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda m: _complete(client, m), [*MODELS, *MODELS]))
        again = {m: _complete(client, m) for m in MODELS}
    assert {r.status_code for r in answers} == {200}
    slots = {m: r.headers["x-sie-slot"] for m, r in again.items()}
    assert len(set(slots.values())) == len(MODELS)
    assert pod.loads() == len(MODELS)
    assert {m: pod.holders(m) for m in MODELS} == {m: [int(s)] for m, s in slots.items()}
    with pod.client() as client:
        merged = {e["id"]: e for e in client.get("/v1/models").json()["data"]}
    assert {m: str(merged[m]["slot"]) for m in MODELS} == slots


def test_stream_through_router_and_worker_ends_with_done(pod: Pod) -> None:
    body = {
        "model": "org/beta",
        "stream": True,
        "messages": [{"role": "user", "content": "one two three"}],
        "max_tokens": 5,
    }
    with pod.client() as client, client.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)


def _stream_to_a_stopped_worker(pod: Pod, headers: dict[str, str]) -> tuple[int, list[str]]:
    """A slow stream of org/gamma whose worker is stopped (SIGSTOP) after its first event:
    the slot it went to, and the stream's data lines after that event."""
    with pod.client() as client:
        first = _complete(client, "org/gamma")
        slot = int(first.headers["x-sie-slot"])
        body = {
            "model": "org/gamma",
            "stream": True,
            "prompt": "x",
            # The stream stalls on the stopped worker until the router gives up on it,
            # however long it is: 40 tokens keep what resumes elsewhere to 2 s.
            "max_tokens": 40,
            "fake": {"token_delay_s": 0.05},
        }
        with client.stream("POST", "/v1/completions", json=body, headers=headers) as r:
            lines = r.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
            os.kill(pod.workers[slot].process.pid, signal.SIGSTOP)
            rest = [line for line in lines if line.startswith("data: ")]
    return slot, rest


def _stopped_slot_leaves_rotation_and_comes_back(pod: Pod, slot: int) -> None:
    assert pod.metric(f'sie_router_slot_up{{slot="{slot}"}}') == 0
    with pod.client() as client:
        moved = _complete(client, "org/gamma")
    assert moved.status_code == 200
    assert int(moved.headers["x-sie-slot"]) != slot
    os.kill(pod.workers[slot].process.pid, signal.SIGCONT)
    wait_until(lambda: pod.metric(f'sie_router_slot_up{{slot="{slot}"}}') == 1, timeout=20)


def test_a_stopped_workers_stream_resumes_on_another_slot_and_the_worker_leaves_rotation(
    pod: Pod,
) -> None:
    before = sum(pod.metric(f'sie_router_resumes_total{{reason="{r}"}}') for r in REASONS)
    slot, rest = _stream_to_a_stopped_worker(pod, {})
    assert rest[-1] == "data: [DONE]"
    assert not [line for line in rest if '"error"' in line]
    after = sum(pod.metric(f'sie_router_resumes_total{{reason="{r}"}}') for r in REASONS)
    assert after == before + 1
    _stopped_slot_leaves_rotation_and_comes_back(pod, slot)


def test_with_resume_off_a_stopped_workers_stream_fails_and_the_worker_leaves_rotation(
    pod: Pod,
) -> None:
    slot, rest = _stream_to_a_stopped_worker(pod, {"X-SIE-Resume": "off"})
    error = json.loads(rest[-1].removeprefix("data: "))
    assert error["error"]["code"] == "engine_unavailable"
    _stopped_slot_leaves_rotation_and_comes_back(pod, slot)


def test_killed_worker_is_routed_around(pod: Pod) -> None:
    with pod.client() as client:
        first = _complete(client, "org/alpha")
        slot = int(first.headers["x-sie-slot"])
        pod.workers[slot].process.kill()
        pod.workers[slot].process.wait()
        again = _complete(client, "org/alpha")
    assert again.status_code == 200, (again.text, pod.log_path.read_text()[-3000:])
    assert int(again.headers["x-sie-slot"]) != slot
    ready = loopback.get(pod.url + "/readyz", timeout=5)
    assert ready.status_code == 200
    assert [s["up"] for s in ready.json()["slots"]].count(False) == 1


def test_sie_sdk_through_the_router_keeps_a_model_on_one_slot(pod: Pod, sie_sdk: SdkRunner) -> None:
    result = sie_sdk.run(
        """
client = SIEClient(url)
texts = [client.generate(model, "hello pod", max_new_tokens=3)["text"] for _ in range(4)]
chunks = list(client.stream_generate(model, "hello pod", max_new_tokens=3))
result = {"texts": texts, "last": chunks[-1], "models": client.list_models(),
          "detail": client.get_model(model.upper()),
          "missing": error_of(client.get_model, "org/nope")}
""",
        url=pod.url,
        model="org/alpha",
    )
    assert result["texts"] == ["hello pod hello"] * 4
    assert result["last"]["done"] is True
    assert pod.loads() == 1
    (slot,) = pod.holders("org/alpha")
    with pod.client() as client:
        again = client.post("/v1/generate/org__alpha", json={"prompt": "x", "max_new_tokens": 1})
    assert again.headers["x-sie-slot"] == str(slot)
    infos = {m["name"]: m for m in result["models"]}
    assert set(infos) == set(MODELS)
    assert infos["org/alpha"]["state"] == "loaded"
    assert infos["org/beta"]["state"] == "available"
    assert (result["detail"]["id"], result["detail"]["state"]) == ("org/alpha", "loaded")
    assert (result["missing"]["code"], result["missing"]["status_code"]) == ("MODEL_NOT_FOUND", 404)
