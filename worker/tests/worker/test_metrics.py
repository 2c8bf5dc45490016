"""The worker's series: those alerts read exist at zero from the start; streams are timed."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from sie_worker.errors import EngineTimeout, ModelLoading
from sie_worker.worker.loading import load_outcome
from sie_worker.worker.metrics import (
    DOWNLOAD_OUTCOMES,
    EVICTION_REASONS,
    LOAD_OUTCOMES,
    StreamTimer,
    WorkerMetrics,
)


def _samples(metrics: WorkerMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = metrics.render().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_counters_that_alerts_read_exist_at_zero_for_every_label_value_before_any_event() -> None:
    samples = _samples(WorkerMetrics(["cuda:0", "cuda:1"]))

    for name, label, values in (
        ("sie_model_loads_total", "outcome", LOAD_OUTCOMES),
        ("sie_model_evictions_total", "reason", EVICTION_REASONS),
        ("sie_model_downloads_total", "outcome", DOWNLOAD_OUTCOMES),
    ):
        for value in values:
            assert samples[(name, ((label, value),))] == 0.0, (name, value)
    assert samples[("sie_placement_failures_total", ())] == 0.0


def test_the_label_tables_hold_the_values_the_worker_uses() -> None:
    assert "engine_exit" in EVICTION_REASONS
    assert "make_room" in EVICTION_REASONS
    assert {"ready", "failed", "cancelled", "placement_failed", "startup_timeout"} <= set(
        LOAD_OUTCOMES
    )
    assert {"downloaded", "cached", "failed", "cancelled"} == set(DOWNLOAD_OUTCOMES)


def test_a_load_error_whose_code_is_not_in_the_table_counts_as_failed() -> None:
    assert load_outcome(EngineTimeout("x")) == "failed"
    assert load_outcome(ModelLoading("x")) == "failed"
    assert load_outcome(RuntimeError("x")) == "failed"


class _Recorder:
    def __init__(self) -> None:
        self.values: list[float] = []

    def observe(self, amount: float) -> None:
        self.values.append(amount)


def test_a_stream_timer_observes_time_to_first_write_then_the_gaps_between_writes() -> None:
    ttft, itl = _Recorder(), _Recorder()
    timer = StreamTimer(ttft, itl, started=10.0)

    for now in (10.5, 10.6, 10.9):
        timer.chunk(now)

    assert ttft.values == [0.5]
    assert [round(v, 6) for v in itl.values] == [0.1, 0.3]


def test_stream_timers_feed_the_per_model_histograms() -> None:
    metrics = WorkerMetrics(["cpu"])
    timer = metrics.stream_timer("org/m", started=0.0)
    timer.chunk(0.2)
    timer.chunk(0.25)

    samples = _samples(metrics)
    model = (("model", "org/m"),)
    assert samples[("sie_time_to_first_token_seconds_count", model)] == 1.0
    assert samples[("sie_time_to_first_token_seconds_sum", model)] == 0.2
    assert samples[("sie_inter_token_latency_seconds_count", model)] == 1.0


def test_each_models_state_is_one_for_its_state_and_a_removed_model_leaves() -> None:
    metrics = WorkerMetrics(["cpu"])
    metrics.set_model_states({"org/a": "loading", "org/b": "ready"})
    metrics.set_model_states({"org/a": "ready"})

    samples = _samples(metrics)
    state = {k[1]: v for k, v in samples.items() if k[0] == "sie_model_state"}
    assert state[(("model", "org/a"), ("state", "ready"))] == 1.0
    assert state[(("model", "org/a"), ("state", "loading"))] == 0.0
    assert not any(("model", "org/b") in labels for labels in state)
