"""The whole worker's model-server series: its engines' loads, or its own count without them."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from sie_worker.model_server_series import ServerLoad, parse
from sie_worker.worker.metrics import WorkerMetrics


def _worker(states: dict[str, str], inflight: dict[str, int]) -> WorkerMetrics:
    metrics = WorkerMetrics(["cuda:0", "cuda:1"])
    metrics.set_model_states(states)
    for model, count in inflight.items():
        metrics.inflight.labels(model=model).inc(count)
    return metrics


def test_engines_that_report_a_load_add_up_and_the_fullest_kv_cache_counts() -> None:
    metrics = _worker({"org/a": "ready", "org/b": "ready"}, {"org/a": 9, "org/b": 9})
    engines = {
        "org/a": ServerLoad(waiting=1, running=4, kv_usage=0.5),
        "org/b": ServerLoad(waiting=2, running=3, kv_usage=0.75),
    }

    load = parse(metrics.render(engines).decode())

    # the engines' own figures, not the worker's in-flight count
    assert load == ServerLoad(
        waiting=3, running=7, kv_usage=0.75, ready=frozenset({"org/a", "org/b"}), max_lora=2
    )


def test_a_ready_model_without_engine_series_counts_its_requests_in_flight_as_running() -> None:
    # The default engine exports no /metrics; an engine that did not answer is the same.
    metrics = _worker({"org/default": "ready", "org/sglang": "ready"}, {"org/default": 2})
    engines = {"org/sglang": ServerLoad(waiting=1, running=1, kv_usage=0.25)}

    load = parse(metrics.render(engines).decode())

    assert load is not None
    assert (load.waiting, load.running, load.kv_usage) == (1, 3, 0.25)


def test_ready_models_run_loading_ones_wait_and_max_lora_is_the_device_count() -> None:
    metrics = _worker({"org/a": "ready", "org/b": "loading", "org/c": "failed"}, {})

    text = metrics.render().decode()

    info = [
        s
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "sie_worker_lora_requests_info"
    ]
    assert [(s.labels, s.value) for s in info] == [
        (
            {"max_lora": "2", "running_lora_adapters": "org/a", "waiting_lora_adapters": "org/b"},
            1.0,
        )
    ]


def test_engine_loads_of_models_no_longer_ready_are_not_counted() -> None:
    # A scrape that raced an eviction: the worker's states decide which models count.
    metrics = _worker({"org/a": "unloaded"}, {})

    load = parse(metrics.render({"org/a": ServerLoad(waiting=5, running=5)}).decode())

    assert load == ServerLoad(max_lora=2)
