"""The worker's /metrics as Prometheus reads it: its own series, and its engines' by model."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families
from tests.support.worker_fixtures import WorkerProcess, fake_model

StartWorker = Callable[..., WorkerProcess]


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
