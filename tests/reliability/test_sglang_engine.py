"""A real SGLang engine on cpu devices, started, served, evicted and killed by the worker.

The engine is SGLang 0.5.23 (the ``sglang-cu130`` bundle's release) in ``.venv-sglang``, with
the tests' stand-in for its CPU kernel module; the model a tiny Llama built here, in float32.
The worker's devices are ``cpu:0,cpu:1`` (one core each), so a width-2 model is a real TP=2
engine: SGLang's launcher (HTTP and tokenizer), two scheduler ranks (``sglang::scheduler_TP0``
and ``TP1``) and a detokenizer, their messages through shared memory in ``/dev/shm``; a model
of two pipeline stages is two schedulers ``sglang::scheduler_PP0`` and ``PP1``
(``test_sglang_models``, with the embedding model and a refused flag: a module of its own so
that the ``pytest sglang`` step runs it beside this one). The tests share one worker and run
in order: each leaves the worker as the next one expects. Outputs of random weights are
checked for shape, never for text.
"""

from __future__ import annotations

import json
import math
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
    sglang_shm_left,
    shared_memory,
    start_sglang_worker,
    stream,
)
from tests.reliability._support import Launcher, Worker
from tests.support.sglang_engine import SCHEDULER, sglang_model
from tests.support.sie_sdk import SdkRunner
from tests.support.tiny_models import minilm_model_dir
from tests.support.worker_fixtures import wait_until

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

TP2 = "tiny/sglang-tp2"
TP1 = "tiny/sglang-tp1"
MINILM = "sentence-transformers/all-MiniLM-L6-v2"


@pytest.fixture(scope="module")
def worker(module_launcher: Launcher, tiny_vllm_llama_dir: Path) -> Worker:
    model = tiny_vllm_llama_dir
    configs = [
        sglang_model(TP2, model, width=2),
        sglang_model(TP1, model),
        {
            "sie_id": MINILM,
            "model_path": str(minilm_model_dir()),
            "tasks": {"encode": {"dense": {"dim": 384}}},
            "profiles": {
                "default": {"adapter_path": "sie_server.adapters.transformers:TransformersAdapter"}
            },
        },
    ]
    # Width-1 models share a device by memory: pack them onto one.
    return start_sglang_worker(module_launcher, configs, SIE_PLACEMENT_STRATEGY="pack")


@pytest.fixture(scope="module", autouse=True)
def _no_sglang_shared_memory_left(worker: Worker, module_launcher: Launcher) -> Iterator[None]:
    with sglang_shm_left(worker, module_launcher):
        yield


def test_a_width_2_model_is_two_scheduler_ranks_on_the_blocks_cores(worker: Worker) -> None:
    loaded = load(worker, TP2)
    assert loaded.status_code == 200, loaded.text
    assert loaded.json()["devices"] == ["cpu:0", "cpu:1"]
    group = engine_group(worker, TP2)
    argv = group[0].cmdline()
    assert argv[argv.index("--tp-size") + 1] == "2"
    assert argv[argv.index("--device") + 1] == "cpu"
    assert int(argv[argv.index("--max-total-tokens") + 1]) >= 1024
    environ = group[0].environ()
    assert environ["SGLANG_USE_CPU_ENGINE"] == "1"
    assert environ["SGLANG_CPU_OMP_THREADS_BIND"] == "0|1"
    ranks = rank_processes(group, SCHEDULER)
    assert sorted(ranks) == ["sglang::scheduler_TP0", "sglang::scheduler_TP1"]
    for process in group:  # the engine runs on its block's cores
        assert sorted(process.cpu_affinity()) == [0, 1]
    assert any(path.name.startswith("sgl_shm_mq_") for path in shared_memory(group))


def test_completions_chat_and_streams_come_back_through_the_worker(worker: Worker) -> None:
    completion = complete(worker, TP2, ignore_eos=True)
    assert completion.status_code == 200, completion.text
    body = completion.json()
    assert body["model"] == TP2
    assert body["usage"]["completion_tokens"] == 6
    assert body["choices"][0]["finish_reason"] == "length"
    # Random weights may say end-of-sequence at once: SGLang's ignore_eos keeps them going.
    chat_body = {
        "model": TP2,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 4,
        "ignore_eos": True,
    }
    with worker.client(timeout=300) as client:
        chat = client.post("/v1/chat/completions", json=chat_body)
    assert chat.status_code == 200, chat.text
    assert chat.json()["choices"][0]["message"]["role"] == "assistant"
    events = stream(worker, "/v1/chat/completions", {**chat_body, "max_tokens": 5, "stream": True})
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    plain_body = {"model": TP2, "prompt": "Hi", "max_tokens": 3, "stream": True, "ignore_eos": True}
    plain = stream(worker, "/v1/completions", plain_body)
    assert plain[-1] == "[DONE]"
    assert "".join(json.loads(e)["choices"][0]["text"] for e in plain[:-1])


def test_the_openai_client_and_sie_sdks_generate_work_unchanged(
    worker: Worker, sie_sdk: SdkRunner
) -> None:
    client = OpenAI(base_url=f"{worker.url}/v1", api_key="unused", timeout=300)
    answer = client.completions.create(
        model=TP2, prompt="Hello", max_tokens=4, extra_body={"ignore_eos": True}
    )
    assert answer.usage is not None
    assert answer.usage.completion_tokens == 4
    streamed = list(
        client.chat.completions.create(
            model=TP2,
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=3,
            stream=True,
            extra_body={"ignore_eos": True},
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
    # SIE's generate has no ignore_eos: random weights may end a text early, and then say so.
    tokens, finish = generated["usage"]["completion_tokens"], generated["finish_reason"]
    assert (tokens == 4 and finish == "length") or (0 < tokens < 4 and finish == "stop")
    assert result["chunks"][-1]["finish_reason"] in ("length", "stop")


def test_the_model_server_series_come_from_sglangs_own_metrics(worker: Worker) -> None:
    assert complete(worker, TP2).status_code == 200
    with worker.client() as client:
        text = client.get("/metrics").text
    values: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name.startswith(("sglang:", "sie_worker_requests_", "sie_worker_kv_cache_")):
            values[name] = float(value)
    passed = {name.split("{")[0] for name in values if name.startswith("sglang:")}
    assert {"sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage"} <= passed
    assert values["sie_worker_requests_waiting"] == 0.0
    assert values["sie_worker_requests_running"] == 0.0
    usage = values["sie_worker_kv_cache_usage_ratio"]
    assert 0.0 <= usage <= 1.0
    sglang_usage = max(v for k, v in values.items() if k.startswith("sglang:token_usage{"))
    assert math.isclose(usage, sglang_usage)


def test_a_rank_killed_fails_the_model_and_the_next_request_loads_it_again(worker: Worker) -> None:
    group = engine_group(worker, TP2)
    files = shared_memory(group)
    rank = rank_processes(group, SCHEDULER)["sglang::scheduler_TP1"]
    rank.send_signal(signal.SIGKILL)
    wait_until(lambda: worker.models()[TP2]["state"] == "failed", timeout=60)
    model = worker.models()[TP2]
    assert f"its rank process 'sglang::scheduler_TP1' (pid {rank.pid}) exited" in model["error"]
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
    assert complete(worker, TP1).status_code == 200
    with worker.client(timeout=120) as client:
        embedded = client.post("/v1/embeddings", json={"model": MINILM, "input": "Hello"})
    assert embedded.status_code == 200, embedded.text
    assert len(embedded.json()["data"][0]["embedding"]) == 384


def test_unloading_leaves_no_process_and_no_shared_memory(worker: Worker) -> None:
    group = engine_group(worker, TP1)
    files = shared_memory(group)
    assert files, "SGLang's message queues are in /dev/shm"
    with worker.client(timeout=120) as client:
        assert client.post(f"/v1/models/{TP1}/unload").status_code == 200
    assert gone(group, files)  # the unload answers once the engine is gone
