"""A model's need on a device and its engine's share: DESIGN "Device memory"'s arithmetic."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sie_worker.sizing.memory_needs import (
    GIB,
    NoRoomAtStart,
    cuda_cap,
    memory_need,
    sglang_fraction,
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
