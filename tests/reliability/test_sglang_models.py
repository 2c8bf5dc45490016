"""Real SGLang engines on cpu devices beside the width-2 one of ``test_sglang_engine``: an
embedding model, a flag SGLang refuses, and a model of two pipeline stages whose second stage
is killed.

A module of its own, with its own worker on ``cpu:0,cpu:1``, so that the ``pytest sglang``
step runs it beside ``test_sglang_engine`` (``scripts/test``'s engines table: two modules at
once). The tests share the worker and run in order; outputs of random weights are checked for
shape, never for text.
"""

from __future__ import annotations

import json
import math
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
    sglang_shm_left,
    shared_memory,
    start_sglang_worker,
    stream,
)
from tests.reliability._support import Launcher, Worker
from tests.support.sglang_engine import SCHEDULER, sglang_model
from tests.support.sie_sdk import SdkRunner
from tests.support.worker_fixtures import wait_until

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

PP2 = "tiny/sglang-pp2"
EMBED = "tiny/sglang-embed"
BAD = "tiny/sglang-bad-flag"


@pytest.fixture(scope="module")
def worker(module_launcher: Launcher, tiny_vllm_llama_dir: Path) -> Worker:
    model = tiny_vllm_llama_dir
    configs = [
        sglang_model(EMBED, model, embedding=True),
        sglang_model(BAD, model, args=["--max-running-requests", "many"]),
        sglang_model(PP2, model, pipeline_parallel_size=2),
    ]
    return start_sglang_worker(module_launcher, configs)


@pytest.fixture(scope="module", autouse=True)
def _no_sglang_shared_memory_left(worker: Worker, module_launcher: Launcher) -> Iterator[None]:
    with sglang_shm_left(worker, module_launcher):
        yield


def test_an_embedding_model_answers_openai_embeddings_and_sie_encode(
    worker: Worker, sie_sdk: SdkRunner
) -> None:
    loaded = load(worker, EMBED)
    assert loaded.status_code == 200, loaded.text
    with worker.client(timeout=120) as client:
        embedded = client.post("/v1/embeddings", json={"model": EMBED, "input": ["Hello", "Hi"]})
    assert embedded.status_code == 200, embedded.text
    vectors = [d["embedding"] for d in embedded.json()["data"]]
    assert [len(v) for v in vectors] == [128, 128]
    result = sie_sdk.run(
        "client = SIEClient(url, timeout_s=300)\n"
        "dense = client.encode(model, {'text': 'Hello'})['dense']\n"
        "result = {'dim': int(dense.shape[0]), 'dtype': str(dense.dtype),\n"
        "          'values': [float(x) for x in dense]}",
        url=worker.url,
        model=EMBED,
    )
    assert (result["dim"], result["dtype"]) == (128, "float32")
    assert all(math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-5) for a, b in zip(
        result["values"], vectors[0], strict=True
    ))  # fmt: skip


def test_unloading_leaves_no_process_and_no_shared_memory(worker: Worker) -> None:
    group = engine_group(worker, EMBED)
    files = shared_memory(group)
    assert files, "SGLang's message queues are in /dev/shm"
    with worker.client(timeout=120) as client:
        assert client.post(f"/v1/models/{EMBED}/unload").status_code == 200
    assert gone(group, files)  # the unload answers once the engine is gone


def test_a_flag_sglang_refuses_fails_the_load_with_sglangs_own_message(worker: Worker) -> None:
    refused = load(worker, BAD)
    assert refused.status_code == 502, refused.text
    error = refused.json()["error"]
    assert error["code"] == "load_failed"
    assert "argument --max-running-requests: invalid int value: 'many'" in error["message"]
    assert worker.models()[BAD]["state"] == "failed"
    assert worker.engines().get(BAD) is None


def test_a_model_of_two_pipeline_stages_answers_and_its_second_stage_killed_fails_it(
    worker: Worker,
) -> None:
    loaded = load(worker, PP2)
    assert loaded.status_code == 200, loaded.text
    assert loaded.json()["devices"] == ["cpu:0", "cpu:1"]
    group = engine_group(worker, PP2)
    argv = group[0].cmdline()
    assert argv[argv.index("--pp-size") + 1] == "2"
    assert argv[argv.index("--tp-size") + 1] == "1"
    stages = rank_processes(group, SCHEDULER)
    assert sorted(stages) == ["sglang::scheduler_PP0", "sglang::scheduler_PP1"]
    completion = complete(worker, PP2, ignore_eos=True)
    assert completion.status_code == 200, completion.text
    assert completion.json()["usage"]["completion_tokens"] == 6
    chat = {"model": PP2, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
            "stream": True, "ignore_eos": True}  # fmt: skip
    events = stream(worker, "/v1/chat/completions", chat)
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
    files = shared_memory(group)
    stage = stages["sglang::scheduler_PP1"]
    stage.send_signal(signal.SIGKILL)
    wait_until(lambda: worker.models()[PP2]["state"] == "failed", timeout=60)
    model = worker.models()[PP2]
    assert f"its rank process 'sglang::scheduler_PP1' (pid {stage.pid}) exited" in model["error"]
    assert model["devices"] == []
    wait_until(lambda: gone(group, files), timeout=60)  # every process, every shm file
