"""The model-server series an endpoint picker reads: how loads combine, and their text."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from sie_worker.model_server_series import (
    KV_USAGE,
    LORA_INFO,
    RUNNING,
    SERIES,
    WAITING,
    ServerLoad,
    combine,
    parse,
    render,
)

_names = st.frozensets(st.from_regex(r"[a-z]{1,4}/[a-z0-9.-]{1,6}", fullmatch=True), max_size=4)
loads = st.builds(
    ServerLoad,
    waiting=st.integers(0, 1000).map(float),
    running=st.integers(0, 1000).map(float),
    kv_usage=st.floats(0, 1),
    ready=_names,
    loading=_names,
    max_lora=st.integers(0, 8),
)


def _samples(text: bytes) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


@given(st.lists(loads, max_size=5))
def test_counts_add_kv_use_is_the_highest_and_models_join(items: list[ServerLoad]) -> None:
    pod = combine(items)

    assert pod.waiting == sum(i.waiting for i in items)
    assert pod.running == sum(i.running for i in items)
    assert pod.max_lora == sum(i.max_lora for i in items)
    assert pod.kv_usage == max((i.kv_usage for i in items), default=0.0)
    assert pod.ready == frozenset().union(*(i.ready for i in items))
    # a model ready on one worker and loading on another is ready for the pod
    assert pod.loading == frozenset().union(*(i.loading for i in items)) - pod.ready


@given(loads)
def test_what_a_worker_renders_the_router_reads_back(load: ServerLoad) -> None:
    back = parse(render(load).decode())

    assert back is not None
    assert (back.waiting, back.running, back.max_lora) == (
        load.waiting,
        load.running,
        load.max_lora,
    )
    assert math.isclose(back.kv_usage, load.kv_usage)
    assert (back.ready, back.loading) == (load.ready, load.loading)


def test_the_lora_info_series_is_one_sample_of_value_one_with_sorted_joined_models() -> None:
    load = ServerLoad(
        waiting=2,
        running=3,
        kv_usage=0.5,
        ready=frozenset({"org/b", "org/a"}),
        loading=frozenset({"org/c"}),
        max_lora=2,
    )

    samples = _samples(render(load))

    assert samples[LORA_INFO] == [
        (
            {
                "max_lora": "2",
                "running_lora_adapters": "org/a,org/b",
                "waiting_lora_adapters": "org/c",
            },
            1.0,
        )
    ]
    assert samples[WAITING] == [({}, 2.0)]
    assert samples[RUNNING] == [({}, 3.0)]
    assert samples[KV_USAGE] == [({}, 0.5)]


def test_an_idle_worker_reports_zeros_and_empty_lists() -> None:
    samples = _samples(render(combine([])))

    assert {name: samples[name][0][1] for name in SERIES} == dict.fromkeys(SERIES, 0.0) | {
        LORA_INFO: 1.0
    }
    assert samples[LORA_INFO][0][0] == {
        "max_lora": "0",
        "running_lora_adapters": "",
        "waiting_lora_adapters": "",
    }


def test_kv_use_outside_zero_to_one_is_clamped_and_nan_counts_as_zero() -> None:
    assert _samples(render(ServerLoad(kv_usage=1.7)))[KV_USAGE] == [({}, 1.0)]
    assert _samples(render(ServerLoad(kv_usage=math.nan)))[KV_USAGE] == [({}, 0.0)]


def test_text_without_the_series_or_not_prometheus_reads_as_none() -> None:
    assert parse("# TYPE sie_models gauge\nsie_models 1\n") is None
    assert parse("not { prometheus") is None
