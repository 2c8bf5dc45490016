"""A stream survives its real engine (issue 49): two workers, each with one width-1 vLLM
engine (vLLM's CPU build, the tiny Llama, one core each), behind a slot router; the engine
serving a streamed completion of 400 tokens is killed after its first event, and the
client's stream still completes, with no error event: the router resumed it on the other
slot, as the
continuation vLLM's own API takes (the prompt plus the text sent, ``max_tokens`` less the
tokens sent). Random weights: the text is checked for shape, never for content.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.reliability._support import Launcher, Worker, engine_of
from tests.support import loopback
from tests.support.ports import start_on_free_port
from tests.support.vllm_engine import vllm_command, vllm_model
from tests.support.worker_fixtures import wait_until

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

MODEL = "tiny/llama-resume"
# Long enough that the engine is still generating when the client has read the first event
# (the tiny model on one core makes 64 tokens faster than a test can react).
TOKENS = 400


class Router:
    def __init__(self, process: subprocess.Popen[bytes], port: int) -> None:
        self.process, self.port = process, port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture(scope="module")
def workers(module_launcher: Launcher, tiny_vllm_llama_dir: Path) -> list[Worker]:
    env = {"SIE_BUNDLE": "vllm", "SIE_VLLM_COMMAND": vllm_command()}
    config = vllm_model(MODEL, tiny_vllm_llama_dir)
    config["max_sequence_length"] = 512  # the tiny Llama's context
    config["tasks"]["generate"]["max_output_tokens"] = TOKENS
    started = [module_launcher.start([config], devices=f"cpu:{i}", env=env) for i in (0, 1)]

    def load(worker: Worker) -> int:
        with worker.client(timeout=300) as client:
            return client.post(f"/v1/models/{MODEL}/load").status_code

    # why: at once, not one after the other: each engine is pinned to its worker's core, so
    # one start alone leaves the other core idle (two starts took 94 s in a row).
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        assert list(pool.map(load, started)) == [200, 200]
    return started


@pytest.fixture(scope="module")
def router(workers: list[Worker], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Router]:
    log_path = tmp_path_factory.mktemp("router") / "router.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIE_")}
    env |= {"SIE_GPU_COUNT": "2", "SIE_WORKER_PORTS": ",".join(str(w.port) for w in workers)}

    processes: list[subprocess.Popen[bytes]] = []

    def launch(port: int) -> tuple[Router, subprocess.Popen[bytes], Path]:
        argv = [sys.executable, "-m", "sie_worker", "route", "--host", "127.0.0.1"]
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                [*argv, "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT
            )
        processes.append(process)
        return Router(process, port), process, log_path

    def both_slots_ready(router: Router) -> None:
        def ready() -> bool:
            try:
                answer = loopback.get(router.url + "/readyz", timeout=2)
            except httpx.HTTPError:
                return False
            slots = answer.json().get("slots", []) if answer.status_code == 200 else []
            return len(slots) == 2 and all(s.get("ready") for s in slots)

        wait_until(ready, timeout=60)

    try:
        yield start_on_free_port(launch, both_slots_ready)
    finally:
        for process in processes:
            process.terminate()
            process.wait(timeout=30)


def test_a_stream_whose_vllm_engine_is_killed_mid_stream_completes_on_the_other_slot(
    workers: list[Worker], router: Router
) -> None:
    body = {
        "model": MODEL,
        "prompt": "The river ran past the old mill and",
        "max_tokens": TOKENS,
        "temperature": 0,
        "ignore_eos": True,  # vLLM's: the whole length, whatever the random weights say
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    # Found before the request: the kill must follow the first event at once.
    engines = [engine_of(worker, MODEL) for worker in workers]
    groups = [os.getpgid(engine.pid) for engine in engines]
    assert not {os.getpgid(w.process.pid) for w in workers} & set(groups)  # engines' own
    documents, done, killed = [], 0, None
    with loopback.stream("POST", router.url + "/v1/completions", json=body, timeout=300) as r:
        assert r.status_code == 200
        slot = int(r.headers["x-sie-slot"])
        for line in r.iter_lines():
            payload = line.removeprefix("data: ").strip()
            if not payload:
                continue
            if payload == "[DONE]":
                done += 1
                continue
            documents.append(json.loads(payload))
            if killed is None:
                # The first event is out: the engine that sent it dies now, mid-stream.
                os.killpg(groups[slot], signal.SIGKILL)
                killed = engines[slot].pid
    assert killed is not None
    assert [d["error"] for d in documents if "error" in d] == []
    assert done == 1
    assert len({d["id"] for d in documents}) == 1
    text = "".join(c.get("text") or "" for d in documents for c in d.get("choices", []))
    assert text
    usage = [d["usage"] for d in documents if d.get("usage")]
    assert len(usage) == 1
    assert usage[0]["completion_tokens"] <= TOKENS
    metrics = loopback.get(router.url + "/metrics").text
    resumed = [
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("sie_router_resumes_total{")
    ]
    assert sum(resumed) == 1
