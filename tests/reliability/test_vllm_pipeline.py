"""A real pipeline-parallel vLLM engine (tensor width 1, two stages) on one worker.

The worker's devices are ``cpu:0,cpu:1`` (one core each); a model of
``pipeline_parallel_size: 2`` claims both and runs as two stage processes
(``VLLM::Worker_PP0``/``PP1``), each bound to its device's core. vLLM's CPU build skips its
warm-up in compilation mode NONE and its second stage then fails its first request, so the
worker runs such an engine traced (``--compilation-config {"mode": 2, "backend": "eager"}``)
and refuses at load what would force mode NONE. The tests share one engine start and run in
order (the ``pytest vllm`` step of ``make test``).
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.reliability._engine_group import (
    complete,
    engine_group,
    gone,
    load,
    rank_processes,
    shared_memory,
    stream,
    vllm_shm_left,
)
from tests.reliability._support import Launcher, Worker
from tests.support.vllm_engine import vllm_command, vllm_model
from tests.support.worker_fixtures import wait_until

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

PP2 = "tiny/llama-pp2"
EAGER = "tiny/llama-pp2-eager"
CHAT = {"model": PP2, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def worker(module_launcher: Launcher, tiny_vllm_llama_dir: Path) -> Worker:
    model = tiny_vllm_llama_dir
    configs = [
        vllm_model(PP2, model, pipeline_parallel_size=2, enforce_eager=False),
        vllm_model(EAGER, model, pipeline_parallel_size=2),  # enforce_eager: true
    ]
    env = {
        "SIE_BUNDLE": "vllm",
        "SIE_VLLM_COMMAND": vllm_command(),
        "SIE_ENGINE_STOP_GRACE_S": "10",
    }
    return module_launcher.start(configs, devices="cpu:0,cpu:1", env=env)


@pytest.fixture(scope="module", autouse=True)
def _no_vllm_shared_memory_left(worker: Worker, module_launcher: Launcher) -> Iterator[None]:
    with vllm_shm_left(module_launcher):
        yield


def test_a_model_of_two_stages_is_two_stage_processes_each_on_its_devices_core(
    worker: Worker,
) -> None:
    loaded = load(worker, PP2)
    assert loaded.status_code == 200, loaded.text
    assert loaded.json()["devices"] == ["cpu:0", "cpu:1"]
    assert loaded.json()["width"] == 2
    group = engine_group(worker, PP2)
    argv = group[0].cmdline()
    assert argv[argv.index("--pipeline-parallel-size") + 1] == "2"
    assert argv[argv.index("--tensor-parallel-size") + 1] == "1"
    assert json.loads(argv[argv.index("--compilation-config") + 1]) == {
        "mode": 2,
        "backend": "eager",
    }
    stages = rank_processes(group)
    assert sorted(stages) == ["VLLM::Worker_PP0", "VLLM::Worker_PP1"]
    assert stages["VLLM::Worker_PP0"].cpu_affinity() == [0]
    assert stages["VLLM::Worker_PP1"].cpu_affinity() == [1]


def test_completions_chat_and_streams_answer_through_both_stages(worker: Worker) -> None:
    # The first request is the one a second stage without its warm-up buffer fails.
    completion = complete(worker, PP2)
    assert completion.status_code == 200, completion.text
    body = completion.json()
    assert body["model"] == PP2
    assert body["usage"]["completion_tokens"] == 6
    assert body["choices"][0]["text"]
    with worker.client(timeout=300) as client:
        chat = client.post("/v1/chat/completions", json=CHAT)
    assert chat.status_code == 200, chat.text
    assert chat.json()["choices"][0]["message"]["role"] == "assistant"
    body = {"model": PP2, "prompt": "Hello", "max_tokens": 4, "stream": True}
    events = stream(worker, "/v1/completions", body)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert "".join(c["choices"][0]["text"] for c in chunks)
    chat_events = stream(worker, "/v1/chat/completions", {**CHAT, "stream": True})
    assert chat_events[-1] == "[DONE]"


def test_the_second_stage_killed_fails_the_model_with_the_reason(worker: Worker) -> None:
    group = engine_group(worker, PP2)
    files = shared_memory(group)
    stage = rank_processes(group)["VLLM::Worker_PP1"]
    stage.send_signal(signal.SIGKILL)
    wait_until(lambda: worker.models()[PP2]["state"] == "failed", timeout=60)
    model = worker.models()[PP2]
    assert f"its rank process 'VLLM::Worker_PP1' (pid {stage.pid}) exited" in model["error"]
    assert model["devices"] == []
    wait_until(lambda: gone(group, files), timeout=60)  # every process, every shm file


def test_unloading_leaves_no_process_and_no_shared_memory(worker: Worker) -> None:
    assert load(worker, PP2).status_code == 200
    group = engine_group(worker, PP2)
    files = shared_memory(group)
    assert complete(worker, PP2).status_code == 200
    with worker.client(timeout=120) as client:
        assert client.post(f"/v1/models/{PP2}/unload").status_code == 200
    assert gone(group, files)  # the unload answers once the engine is gone


def test_enforce_eager_with_stages_on_cpu_devices_is_refused_at_load_naming_the_option(
    worker: Worker,
) -> None:
    refused = load(worker, EAGER)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["code"] == "invalid_config"
    assert "enforce_eager" in error["message"]
    assert "pipeline_parallel_size 2 on cpu devices" in error["message"]
    assert "skips its warm-up" in error["message"]
    assert worker.engines().get(EAGER) is None
