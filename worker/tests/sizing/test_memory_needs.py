"""A model's need on a device and its engine's share: DESIGN "Device memory"'s arithmetic."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sie_worker.sizing.memory_needs import (
    GIB,
    MIN_CPU_KV_TOKENS,
    EngineShare,
    NoRoomAtStart,
    cuda_cap,
    engine_share,
    memory_need,
    sglang_cpu_kv_tokens,
    sglang_fraction,
    vllm_cpu_kv_gib,
)


def test_sglang_needs_its_fraction_of_the_device_plus_one_gib() -> None:
    assert memory_need("sglang", 80 * GIB, mem_fraction=0.4) == 32 * GIB + GIB
    assert memory_need("sglang", 80 * GIB) == math.ceil(0.85 * 80 * GIB) + GIB
    assert memory_need("sglang", None, mem_fraction=0.4) is None


def test_the_default_engine_needs_its_weights_times_1_2_plus_one_gib() -> None:
    assert memory_need("transformers", 80 * GIB, weights_bytes=10 * GIB) == 13 * GIB
    assert memory_need("transformers", 80 * GIB, weights_bytes=10 * GIB, on_cpu=True) == (
        13 * GIB + GIB // 2
    )
    assert memory_need("transformers", 80 * GIB) is None


def test_a_declared_memory_gib_is_the_default_engines_need() -> None:
    need = memory_need("transformers", 80 * GIB, memory_gib=2.5, weights_bytes=GIB)
    assert need == int(2.5 * GIB)


def test_the_share_is_the_fraction_of_the_free_memory_floored_to_3_decimals() -> None:
    assert sglang_fraction(80 * GIB, 80 * GIB, 0.4) == 0.4
    assert sglang_fraction(80 * GIB, 47 * GIB, 0.4) == 0.680
    assert sglang_fraction(80 * GIB, 79 * GIB, None) == 0.860  # 68 of 79 GiB: 0.8607...


def test_less_free_memory_than_the_share_is_no_room() -> None:
    with pytest.raises(NoRoomAtStart, match=r"needs 32.0 GiB free but 20.0 GiB is"):
        sglang_fraction(80 * GIB, 20 * GIB, 0.4)
    with pytest.raises(NoRoomAtStart):
        sglang_fraction(80 * GIB, 0, 0.4)


@given(
    total=st.integers(GIB, 200 * GIB),
    fraction=st.floats(0.05, 0.95),
    taken=st.floats(0.0, 0.9),
)
def test_an_engine_never_takes_more_than_it_was_reserved(
    total: int, fraction: float, taken: float
) -> None:
    free = int(total * (1 - taken))
    try:
        share = sglang_fraction(total, free, fraction)
    except NoRoomAtStart:
        assert fraction * total > free
        return
    assert 0 < share <= 1
    assert share * free <= fraction * total + 1  # what SGLang takes is within the reservation


def test_the_default_engine_caps_cuda_at_its_need() -> None:
    assert cuda_cap(13 * GIB, 80 * GIB) == 0.162
    assert cuda_cap(90 * GIB, 80 * GIB) == 1.0


# --- vLLM: a share of the total ---------------------------------------------------------------


def test_vllm_needs_its_utilization_of_the_devices_total() -> None:
    assert memory_need("vllm", 80 * GIB, mem_fraction=0.5) == 40 * GIB
    assert memory_need("vllm", 80 * GIB) == math.ceil(0.9 * 80 * GIB)  # vLLM's default 0.9
    assert memory_need("vllm", None) is None


def test_vllm_is_told_its_declared_utilization_unchanged_by_what_others_use() -> None:
    share = engine_share(
        "vllm",
        on_cuda=True,
        need=40 * GIB,
        totals=[80 * GIB, 80 * GIB],
        frees=[45 * GIB, 60 * GIB],
        declared={"gpu_memory_utilization": 0.5},
    )
    assert share == EngineShare(0.5, None)
    default = engine_share(
        "vllm", on_cuda=True, need=0, totals=[80 * GIB], frees=[80 * GIB], declared={}
    )
    assert default.fraction == 0.9


def test_vllm_does_not_start_where_less_than_its_share_is_free() -> None:
    with pytest.raises(NoRoomAtStart) as refused:
        engine_share(
            "vllm",
            on_cuda=True,
            need=40 * GIB,
            totals=[80 * GIB, 80 * GIB],
            frees=[80 * GIB, 39 * GIB],
            declared={"gpu_memory_utilization": 0.5},
        )
    assert (refused.value.wanted, refused.value.free) == (40 * GIB, 39 * GIB)


def test_vllm_on_cpu_devices_gets_its_share_less_its_weights_as_kv_cache() -> None:
    share = engine_share(
        "vllm",
        on_cuda=False,
        need=0,
        totals=[12 * GIB, 12 * GIB],
        frees=[12 * GIB, 12 * GIB],
        declared={"gpu_memory_utilization": 0.5},
        weights_bytes=4 * GIB,  # 2 GiB per rank
    )
    assert share == EngineShare(0.5, 4)  # 6 GiB share - 2 GiB of weights
    assert vllm_cpu_kv_gib(12 * GIB, 0.1, None, 2) == 1  # 1.2 GiB: whole GiB
    assert vllm_cpu_kv_gib(12 * GIB, 0.01, 10 * GIB, 1) == 1  # never below 1


@given(
    st.integers(min_value=GIB, max_value=2048 * GIB),
    st.floats(min_value=0.01, max_value=0.99),
    st.integers(min_value=0, max_value=512 * GIB),
    st.integers(min_value=1, max_value=8),
)
def test_vllms_cpu_kv_cache_fits_its_share_and_is_at_least_one_gib(
    total: int, fraction: float, weights: int, width: int
) -> None:
    kv = vllm_cpu_kv_gib(total, fraction, weights, width)
    assert kv >= 1
    assert kv == 1 or kv * GIB + weights / width <= fraction * total


def test_sglang_and_the_default_engine_shares_are_unchanged_by_engine_share() -> None:
    sglang = engine_share(
        "sglang", on_cuda=True, need=0, totals=[80 * GIB], frees=[40 * GIB],
        declared={"mem_fraction_static": 0.4},
    )  # fmt: skip
    assert sglang == EngineShare(sglang_fraction(80 * GIB, 40 * GIB, 0.4))
    default = engine_share(
        "transformers", on_cuda=True, need=13 * GIB, totals=[80 * GIB], frees=[80 * GIB],
        declared={},
    )  # fmt: skip
    assert default == EngineShare(cuda_cap(13 * GIB, 80 * GIB))
    on_cpu = engine_share(
        "transformers", on_cuda=False, need=GIB, totals=[8 * GIB], frees=[8 * GIB], declared={}
    )
    assert on_cpu == EngineShare(None)


def test_sglang_on_cpu_devices_gets_its_kv_cache_in_tokens_from_its_share() -> None:
    # 0.5 x 16 GiB, less half of 2 GiB of weights per rank, over 1 KiB a token per rank.
    share = engine_share(
        "sglang",
        on_cuda=False,
        need=9 * GIB,
        totals=[16 * GIB, 16 * GIB],
        frees=[16 * GIB, 16 * GIB],
        declared={"mem_fraction_static": 0.5},
        weights_bytes=2 * GIB,
        kv_token_bytes=1024,
    )
    assert share == EngineShare(0.5, None, (8 * GIB - GIB) // 1024)
    # On GPUs SGLang sizes its cache from its fraction; without a shape, no cap either.
    on_cuda = engine_share(
        "sglang",
        on_cuda=True,
        need=9 * GIB,
        totals=[16 * GIB],
        frees=[16 * GIB],
        declared={"mem_fraction_static": 0.5},
        weights_bytes=2 * GIB,
        kv_token_bytes=1024,
    )
    assert on_cuda.kv_tokens is None
    assert (
        engine_share(
            "sglang", on_cuda=False, need=0, totals=[16 * GIB], frees=[16 * GIB], declared={}
        ).kv_tokens
        is None
    )


@given(
    total=st.integers(1, 2**40),
    fraction=st.floats(0.001, 1.0),
    weights=st.integers(0, 2**40),
    width=st.integers(1, 16),
    token=st.floats(1.0, 2.0**20),
)
def test_sglangs_cpu_kv_tokens_hold_the_share_less_the_weights_and_never_fall_below_the_floor(
    total: int, fraction: float, weights: int, width: int, token: float
) -> None:
    tokens = sglang_cpu_kv_tokens(total, fraction, weights, width, token)
    assert tokens >= MIN_CPU_KV_TOKENS
    if tokens > MIN_CPU_KV_TOKENS:
        assert tokens * token <= fraction * total - weights / width
        assert (tokens + 1) * token > fraction * total - weights / width
