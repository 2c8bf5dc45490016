"""A real tensor-parallel vLLM engine started, served, evicted and killed by the worker.

The engine is vLLM's CPU build (``.venv-vllm``), the model a tiny Llama built here; the
worker's devices are ``cpu:0,cpu:1`` (one core each), so a width-2 model is a real TP=2
engine: an API server, an engine core and one worker process per rank, their all-reduce
through shared memory in ``/dev/shm``. The tests share one worker and run in order (the
``pytest vllm`` step of ``make test``): each leaves the worker as the next one expects.
Outputs of random weights are checked for shape, never for text.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import OpenAI

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
from tests.support.sie_sdk import SdkRunner
from tests.support.tiny_models import minilm_model_dir
from tests.support.vllm_engine import vllm_command, vllm_model
from tests.support.worker_fixtures import wait_until

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

TP2 = "tiny/llama-tp2"
TP1 = "tiny/llama-tp1"
BAD = "tiny/llama-bad-flag"
MINILM = "sentence-transformers/all-MiniLM-L6-v2"


@pytest.fixture(scope="module")
def worker(
    module_launcher: Launcher, tiny_vllm_llama_dir: Path, tiny_vllm_lora_dir: Path
) -> Worker:
    model, lora = tiny_vllm_llama_dir, tiny_vllm_lora_dir
    configs = [
        vllm_model(TP2, model, width=2),
        # float32: on a CPU with AMX tiles (2026-12-07) the rank of this LoRA model in
        # bfloat16 died of SIGILL (exit -4) on its first request; vLLM 0.32's CPU build sends
        # a tiny model's small bf16 GEMMs to its AMX kernel, which float32 never takes.
        vllm_model(TP1, model, lora_paths={"sql": str(lora)}, max_lora_rank=8, precision="float32"),
        vllm_model(BAD, model, args=["--max-num-seqs", "many"]),
        {
            "sie_id": MINILM,
            "model_path": str(minilm_model_dir()),
            "tasks": {"encode": {"dense": {"dim": 384}}},
            "profiles": {
                "default": {"adapter_path": "sie_server.adapters.transformers:TransformersAdapter"}
            },
        },
    ]
    env = {
        "SIE_BUNDLE": "vllm",
        "SIE_VLLM_COMMAND": vllm_command(),
        # Width-1 models share a device by memory: pack them onto one.
        "SIE_PLACEMENT_STRATEGY": "pack",
        "SIE_ENGINE_STOP_GRACE_S": "10",
    }
    return module_launcher.start(configs, devices="cpu:0,cpu:1", env=env)


def test_a_width_2_model_is_two_rank_processes_each_on_its_devices_core(worker: Worker) -> None:
    loaded = load(worker, TP2)
    assert loaded.status_code == 200, loaded.text
    assert loaded.json()["devices"] == ["cpu:0", "cpu:1"]
    group = engine_group(worker, TP2)
    ranks = rank_processes(group)
    assert sorted(ranks) == ["VLLM::Worker_TP0", "VLLM::Worker_TP1"]
    assert ranks["VLLM::Worker_TP0"].cpu_affinity() == [0]
    assert ranks["VLLM::Worker_TP1"].cpu_affinity() == [1]
    assert shared_memory(group), "the ranks' all-reduce buffers are in /dev/shm"


def test_completions_chat_and_streams_come_back_through_the_worker(worker: Worker) -> None:
    completion = complete(worker, TP2)
    assert completion.status_code == 200, completion.text
    body = completion.json()
    assert body["model"] == TP2
    assert body["usage"]["completion_tokens"] == 6
    assert body["choices"][0]["finish_reason"] == "length"
    with worker.client(timeout=300) as client:
        chat = client.post(
            "/v1/chat/completions",
            json={"model": TP2, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
        )
    assert chat.status_code == 200, chat.text
    assert chat.json()["choices"][0]["message"]["role"] == "assistant"
    events = stream(
        worker,
        "/v1/chat/completions",
        {"model": TP2, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5,
         "stream": True},
    )  # fmt: skip
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)


def test_the_openai_client_and_sie_sdks_generate_work_unchanged(
    worker: Worker, sie_sdk: SdkRunner
) -> None:
    client = OpenAI(base_url=f"{worker.url}/v1", api_key="unused", timeout=300)
    answer = client.completions.create(model=TP2, prompt="Hello", max_tokens=4)
    assert answer.usage is not None
    assert answer.usage.completion_tokens == 4
    streamed = list(
        client.chat.completions.create(
            model=TP2, messages=[{"role": "user", "content": "Hi"}], max_tokens=3, stream=True
        )
    )
    assert streamed[-1].choices[0].finish_reason == "length"
    result = sie_sdk.run(
        "client = SIEClient(url, timeout_s=300)\n"
        "result = {'generated': client.generate(model, 'The quick brown', max_new_tokens=4),\n"
        "          'chunks': list(client.stream_generate(model, 'Hi', max_new_tokens=3))}",
        url=worker.url,
        model=TP2,
    )
    generated = result["generated"]
    assert generated["model"] == TP2
    assert generated["usage"]["completion_tokens"] == 4
    assert generated["finish_reason"] == "length"
    assert result["chunks"][-1]["finish_reason"] == "length"


def test_vllms_own_series_pass_through_the_workers_metrics(worker: Worker) -> None:
    with worker.client() as client:
        text = client.get("/metrics").text
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
    ):
        assert any(
            line.startswith(f"{name}{{") and f'model="{TP2}"' in line for line in text.splitlines()
        ), name


def test_a_rank_killed_fails_the_model_and_the_next_request_loads_it_again(worker: Worker) -> None:
    group = engine_group(worker, TP2)
    files = shared_memory(group)
    rank = rank_processes(group)["VLLM::Worker_TP1"]
    rank.send_signal(signal.SIGKILL)
    wait_until(lambda: worker.models()[TP2]["state"] == "failed", timeout=60)
    model = worker.models()[TP2]
    assert f"its rank process 'VLLM::Worker_TP1' (pid {rank.pid}) exited" in model["error"]
    assert model["devices"] == []
    wait_until(lambda: gone(group, files), timeout=60)  # every process, every shm file
    again = complete(worker, TP2)
    assert again.status_code == 200, again.text
    assert worker.models()[TP2]["state"] == "ready"


def test_a_width_1_model_evicts_the_group_and_shares_its_device_with_a_default_engine_model(
    worker: Worker,
) -> None:
    group = engine_group(worker, TP2)
    files = shared_memory(group)
    assert load(worker, TP1).status_code == 200  # every device is the group's: it goes
    wait_until(lambda: gone(group, files), timeout=60)
    assert worker.models()[TP2]["state"] == "unloaded"
    assert load(worker, MINILM).status_code == 200
    models = worker.models()
    assert models[TP1]["devices"] == models[MINILM]["devices"]  # one device, by memory
    shared = {d["device"]: d["models"] for d in worker.get("/v1/devices")["devices"]}
    assert sorted(shared[models[TP1]["devices"][0]]) == sorted([TP1, MINILM])
    assert complete(worker, TP1).status_code == 200
    # Its LoRA adapter, named as SGLang's clients name one: vLLM gets it as the model.
    adapted = complete(worker, f"{TP1}:sql")
    assert adapted.status_code == 200, adapted.text
    assert adapted.json()["usage"]["completion_tokens"] == 6
    unknown = complete(worker, TP1, lora_path="nope")
    assert unknown.status_code == 404, unknown.text
    with worker.client(timeout=120) as client:
        embedded = client.post("/v1/embeddings", json={"model": MINILM, "input": "Hello"})
    assert embedded.status_code == 200, embedded.text
    assert len(embedded.json()["data"][0]["embedding"]) == 384


def test_unloading_leaves_no_process_and_no_shared_memory(worker: Worker) -> None:
    group = engine_group(worker, TP1)
    files = shared_memory(group)
    with worker.client(timeout=120) as client:
        assert client.post(f"/v1/models/{TP1}/unload").status_code == 200
    assert gone(group, files)  # the unload answers once the engine is gone


def test_a_flag_vllm_refuses_fails_the_load_with_vllms_own_message(worker: Worker) -> None:
    refused = load(worker, BAD)
    assert refused.status_code == 502, refused.text
    error = refused.json()["error"]
    assert error["code"] == "load_failed"
    assert "argument --max-num-seqs: invalid" in error["message"]  # vLLM's parser said it
    assert worker.models()[BAD]["state"] == "failed"
    assert worker.engines().get(BAD) is None


@pytest.fixture(scope="module", autouse=True)
def _no_vllm_shared_memory_left(worker: Worker, module_launcher: Launcher) -> Iterator[None]:
    with vllm_shm_left(module_launcher):
        yield
