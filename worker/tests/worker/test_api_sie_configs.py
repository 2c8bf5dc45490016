"""SIE's config format through a running worker (fake SGLang engine): runtime options reach
the engine and bound its answers, and SIE adapters this image does not run answer 400."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from tests.support.worker_fixtures import WorkerProcess, fake_model

StartWorker = Callable[..., WorkerProcess]
CANDLE = "sie_server_rust.adapters.candle:CandleEmbeddingAdapter"


def _with_runtime(sie_id: str, runtime: dict[str, Any]) -> dict[str, Any]:
    config = fake_model(sie_id)
    config["profiles"]["default"]["adapter_options"]["runtime"] = runtime
    return config


def test_runtime_timeouts_fail_the_request_and_keep_the_engine(start_worker: StartWorker) -> None:
    config = _with_runtime(
        "org/m", {"first_chunk_timeout_s": 1, "inter_chunk_timeout_s": 1, "overall_timeout_s": 20}
    )
    worker = start_worker([config], devices="cuda:0")
    with worker.client() as client:
        slow = client.post(
            "/v1/completions", json={"model": "org/m", "prompt": "x", "fake": {"delay_s": 5}}
        )
        assert slow.status_code == 504
        error = slow.json()["error"]
        assert error["code"] == "engine_timeout"
        assert "first_chunk_timeout_s=1s" in error["message"]
        stalled = client.post(
            "/v1/completions",
            json={"model": "org/m", "prompt": "x", "stream": True, "fake": {"stall_after": 2}},
        )
        assert stalled.status_code == 200
        last = [e for e in stalled.text.split("\n\n") if e.strip()][-1]
        assert json.loads(last.removeprefix("data: "))["error"]["code"] == "engine_timeout"
        assert "inter_chunk_timeout_s=1s" in last
        # The engine kept running: the next request is served by the same engine.
        ok = client.post("/v1/completions", json={"model": "org/m", "prompt": "x"})
        assert ok.status_code == 200
    assert worker.models()["org/m"]["state"] == "ready"


def test_an_sie_adapter_this_image_does_not_run_answers_invalid_config(
    start_worker: StartWorker,
) -> None:
    candle = {
        "sie_id": "BAAI/bge-small-en-v1.5",
        "hf_id": "BAAI/bge-small-en-v1.5",
        "tasks": {"encode": {"dense": {"dim": 384}, "sparse": None}, "score": None},
        "max_sequence_length": 512,
        "profiles": {"candle": {"adapter_path": CANDLE, "max_batch_tokens": 16384}},
    }
    worker = start_worker([candle], devices="cuda:0")
    with worker.client() as client:
        refused = client.post(
            "/v1/embeddings", json={"model": "BAAI/bge-small-en-v1.5:candle", "input": "hi"}
        )
        bare = client.post("/v1/embeddings", json={"model": "BAAI/bge-small-en-v1.5", "input": "x"})
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["code"] == "invalid_config"
    assert CANDLE in error["message"]
    assert "default, llamacpp, sglang, sglang-cu130, vllm" in error["message"]
    assert "candle bundle" in error["message"]
    # Without a default profile the bare sie_id is not served (as in SIE).
    assert bare.status_code == 404
