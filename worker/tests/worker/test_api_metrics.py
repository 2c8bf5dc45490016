"""The worker's /metrics as Prometheus reads it: its own series, its model-server series,
and its engines' by model."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from tests.support.worker_fixtures import WorkerProcess, fake_model, wait_until

StartWorker = Callable[..., WorkerProcess]
# A stream that lasts: 400 tokens, 0.25 s apart.
_SLOW = {"max_tokens": 20, "fake": {"tokens": 400, "token_delay_s": 0.25}}


def _series(worker: WorkerProcess) -> dict[str, list[tuple[dict[str, str], float]]]:
    with worker.client() as client:
        text = client.get("/metrics").text
    series: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            series.setdefault(s.name, []).append((s.labels, s.value))
    return series


def test_a_ready_sglang_engines_metrics_pass_through_labelled_with_the_model(
    start_worker: StartWorker,
) -> None:
    worker = start_worker([fake_model("org/m"), fake_model("org/n")], devices="cuda:0,cuda:1")
    assert "sglang:num_queue_reqs" not in _series(worker)  # nothing loaded yet

    with worker.client() as client:
        for model in ("org/m", "org/n"):
            assert client.post(f"/v1/models/{model}/load").status_code == 200
        body = {
            "model": "org/m",
            "prompt": "a b",
            "max_tokens": 4,
            "stream": True,
            "fake": {"token_delay_s": 0.02},
        }
        with client.stream("POST", "/v1/completions", json=body) as response:
            assert response.status_code == 200
            response.read()

    series = _series(worker)
    queue = {
        labels["model"]: (labels["model_name"], v) for labels, v in series["sglang:num_queue_reqs"]
    }
    assert queue == {"org/m": ("org/m", 0.0), "org/n": ("org/n", 0.0)}
    usage = {labels["model"] for labels, _ in series["sglang:token_usage"]}
    assert usage == {"org/m", "org/n"}
    ttft = {labels["model"]: v for labels, v in series["sie_time_to_first_token_seconds_count"]}
    assert ttft == {"org/m": 1.0}
    itl = {labels["model"]: v for labels, v in series["sie_inter_token_latency_seconds_count"]}
    assert itl["org/m"] >= 1.0


def test_the_workers_model_server_series_read_its_engines_of_either_family(
    start_worker: StartWorker, tmp_path: Path
) -> None:
    never = tmp_path / "never-ready"
    worker = start_worker(
        [
            # SGLang's names: a batch of one, so a second stream waits; a KV cache of 40 tokens
            fake_model(
                "org/s", env={"FAKE_ENGINE_MAX_RUNNING": "1", "FAKE_ENGINE_KV_TOKENS": "40"}
            ),
            fake_model("org/v", env={"FAKE_ENGINE_METRICS": "vllm"}),  # vLLM's names
            # no /metrics, as the default engine: its requests in flight count as running
            fake_model("org/n", env={"FAKE_ENGINE_METRICS": "none"}),
            fake_model("org/l", env={"FAKE_ENGINE_READY_FILE": str(never)}),  # stays loading
        ],
        devices="cuda:0,cuda:1,cuda:2,cuda:3",  # one model each
        env={"SIE_PINNED_MODELS": "org/l"},
    )
    with worker.client() as client:
        for model in ("org/s", "org/v", "org/n"):
            assert client.post(f"/v1/models/{model}/load").status_code == 200
    wait_until(lambda: worker.models()["org/l"]["state"] == "loading", timeout=30)

    with contextlib.ExitStack() as stack:
        readers = []  # a dropped line iterator would close its stream
        for model in ("org/s", "org/s", "org/v", "org/n", "org/n"):
            client = stack.enter_context(worker.client())
            body = {"model": model, "prompt": "a b", "stream": True, **_SLOW}
            response = stack.enter_context(client.stream("POST", "/v1/completions", json=body))
            assert response.status_code == 200
            readers.append(response.iter_lines())
            next(readers[-1])  # past its first event: the engine holds it

        def reads() -> bool:
            return _series(worker)["sie_worker_requests_running"] == [({}, 4.0)]  # 1 + 1 + 2

        wait_until(reads, timeout=10)
        series = _series(worker)

    assert series["sie_worker_requests_waiting"] == [({}, 1.0)]  # org/s's second stream
    assert series["sie_worker_kv_cache_usage_ratio"] == [({}, 1.0)]  # org/s's cache is full
    assert series["sie_worker_lora_requests_info"] == [
        (
            {
                "max_lora": "4",
                "running_lora_adapters": "org/n,org/s,org/v",
                "waiting_lora_adapters": "org/l",
            },
            1.0,
        )
    ]
