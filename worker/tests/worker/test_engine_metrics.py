"""The engines' own metrics on the worker's /metrics: labelled by model, merged per family;
and each engine's load, read under its family's names."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sie_worker.engines.registry import FAMILIES
from sie_worker.model_server_series import ServerLoad
from sie_worker.worker.engine_metrics import engine_load, engine_metrics, merge_families

SGLANG = """# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{{model_name="{m}",tp_rank="0"}} {q}
# HELP sglang:num_requests_total Number of requests.
# TYPE sglang:num_requests_total counter
sglang:num_requests_total{{model_name="{m}",tp_rank="0"}} 7.0
# HELP sglang:e2e_request_latency_seconds Latency.
# TYPE sglang:e2e_request_latency_seconds histogram
sglang:e2e_request_latency_seconds_bucket{{le="1.0",model_name="{m}"}} 1.0
sglang:e2e_request_latency_seconds_bucket{{le="+Inf",model_name="{m}"}} 2.0
sglang:e2e_request_latency_seconds_count{{model_name="{m}"}} 2.0
sglang:e2e_request_latency_seconds_sum{{model_name="{m}"}} 3.5
"""


def _parse(text: bytes) -> dict[str, list[tuple[dict[str, str], float]]]:
    families: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            families.setdefault(s.name, []).append((s.labels, s.value))
    return families


def test_two_engines_families_merge_into_one_block_each_labelled_by_model() -> None:
    text = merge_families(
        [("org/a", SGLANG.format(m="org/a", q=2)), ("org/b", SGLANG.format(m="org/b", q=5))]
    )

    assert text.count(b"# TYPE sglang:num_queue_reqs gauge") == 1
    queue = _parse(text)["sglang:num_queue_reqs"]
    assert sorted((labels["model"], value) for labels, value in queue) == [
        ("org/a", 2.0),
        ("org/b", 5.0),
    ]
    buckets = _parse(text)["sglang:e2e_request_latency_seconds_bucket"]
    assert {labels["model"] for labels, _ in buckets} == {"org/a", "org/b"}
    assert _parse(text)["sglang:num_requests_total"][0][1] == 7.0


def test_garbage_from_one_engine_leaves_only_that_engine_out() -> None:
    text = merge_families([("org/a", "not { prometheus"), ("org/b", SGLANG.format(m="b", q=1))])

    assert [labels["model"] for labels, _ in _parse(text)["sglang:num_queue_reqs"]] == ["org/b"]


def test_an_engine_cannot_shadow_the_workers_own_series() -> None:
    text = merge_families(
        [("org/a", "# TYPE sie_models gauge\nsie_models 9\n" + SGLANG.format(m="a", q=0))]
    )

    assert b"sie_models" not in text
    assert b"sglang:num_queue_reqs" in text


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_engines_that_fail_or_answer_an_error_are_skipped() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.host == "down":
            raise httpx.ConnectError("refused")
        if request.url.host == "missing":
            return httpx.Response(404)
        return httpx.Response(200, text=SGLANG.format(m="up", q=3))

    engines = [("org/up", "http://up"), ("org/down", "http://down"), ("org/x", "http://missing")]
    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        scrape = await engine_metrics(client, engines)
        nothing = await engine_metrics(client, [])

    queue = _parse(scrape.text)["sglang:num_queue_reqs"]
    assert [labels["model"] for labels, _ in queue] == ["org/up"]
    assert scrape.loads == {"org/up": ServerLoad(waiting=3.0)}
    assert (nothing.text, nothing.loads) == (b"", {})


def _gauges(values: dict[str, list[float]]) -> str:
    lines = []
    for name, samples in values.items():
        lines.append(f"# TYPE {name} gauge")
        lines += [f'{name}{{engine="{i}"}} {v}' for i, v in enumerate(samples)]
    return "\n".join(lines) + "\n"


def _load(text: str) -> ServerLoad | None:
    return engine_load(text_string_to_metric_families(text))


def test_sglangs_queue_running_batch_and_token_usage_are_its_load() -> None:
    text = _gauges(
        {
            "sglang:num_queue_reqs": [2],
            "sglang:num_running_reqs": [5],
            "sglang:token_usage": [0.25],
            "sglang:gen_throughput": [99],
        }
    )

    assert _load(text) == ServerLoad(waiting=2, running=5, kv_usage=0.25)


def test_vllms_data_parallel_engines_add_up_and_the_fullest_kv_cache_counts() -> None:
    text = _gauges(
        {
            "vllm:num_requests_waiting": [1, 4],
            "vllm:num_requests_running": [3, 2],
            "vllm:kv_cache_usage_perc": [0.4, 0.9],
        }
    )

    assert _load(text) == ServerLoad(waiting=5, running=5, kv_usage=0.9)


def test_llamacpps_deferred_and_processing_requests_are_its_load_without_a_kv_series() -> None:
    text = _gauges(
        {
            "llamacpp:requests_deferred": [3],
            "llamacpp:requests_processing": [2],
            "llamacpp:n_busy_slots_per_decode": [1.5],
        }
    )

    assert _load(text) == ServerLoad(waiting=3, running=2, kv_usage=0.0)


def test_an_engine_without_load_series_has_no_load() -> None:
    assert _load(_gauges({"sglang:gen_throughput": [1]})) is None


def test_every_family_that_exports_metrics_names_its_load_series() -> None:
    # One home for the engines' series names: the family table.
    for family in FAMILIES.values():
        assert (family.load_series is not None) == family.exports_metrics, family.kind
