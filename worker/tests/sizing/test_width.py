from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.support.sizing_figures import H100, SEED_004_USERS, llama_size

from sie_worker.config.widths import MAX_WIDTH, valid_widths
from sie_worker.sizing.arithmetic import (
    Shape,
    is_power_of_two,
)
from sie_worker.sizing.plan import plan
from sie_worker.sizing.width import choose_width


@pytest.mark.parametrize(
    ("name", "bits", "width"),
    [("8B", 16, 1), ("70B", 16, 4), ("70B", 8, 4), ("70B", 4.5, 2), ("405B", 8, 8)],
)
def test_width_is_smallest_power_of_two_at_or_above_the_minimum(
    name: str, bits: float, width: int
) -> None:
    result = plan(llama_size(name, bits), SEED_004_USERS, H100)
    assert result.width.width == width
    assert result.width.width >= result.min_gpus


def test_seed_004_70b_at_8_bits_explains_why_3_is_not_used() -> None:
    reason = plan(llama_size("70B", 8), SEED_004_USERS, H100).width.reason
    assert "needs 3 GPUs" in reason
    assert "width 3 does not suit the 64 attention heads" in reason


def test_405b_bf16_needs_more_gpus_than_one_engine_spans() -> None:
    # One engine's tensor width stops at 8; the layout (test_layout) takes it to two nodes.
    shape = llama_size("405B", 16).shape
    choice = choose_width(14, shape)
    assert choice.width is None
    assert "needs 14 GPUs" in choice.reason
    result = plan(llama_size("405B", 16), SEED_004_USERS, H100)
    assert result.min_gpus == 14
    assert result.width.width == 16


# Seed 001, gpus_needed.py: need = weights x 1.4 (KV reserve), 90% of an 80 GB card usable.


def test_fourteen_heads_never_get_width_4() -> None:
    # Qwen2.5-0.5B: 14 attention heads, 2 KV heads.
    shape = Shape(layers=24, attention_heads=14, kv_heads=2, head_dim=64)
    assert valid_widths(14, 2) == (1, 2)
    assert choose_width(2, shape).width == 2
    for minimum in (3, 4):
        choice = choose_width(minimum, shape)
        assert choice.width is None
        assert "14 attention heads" in choice.reason
        assert "valid widths: 1, 2" in choice.reason


def test_power_of_two_preferred_over_a_smaller_valid_width_and_reason_says_why() -> None:
    shape = Shape(layers=40, attention_heads=24, kv_heads=24, head_dim=128)
    assert 3 in valid_widths(24, 24)
    choice = choose_width(3, shape, gpus_per_node=8)
    assert choice.width == 4
    assert "preferred over 3" in choice.reason
    assert "leaves 2 idle" in choice.reason


def test_non_power_of_two_width_when_no_power_of_two_suits_the_heads() -> None:
    shape = Shape(layers=40, attention_heads=12, kv_heads=12, head_dim=128)
    choice = choose_width(5, shape)
    assert choice.width == 6
    assert "no power of two" in choice.reason


@given(
    heads=st.integers(1, 256),
    kv_divisor=st.integers(1, 64),
    minimum=st.integers(1, MAX_WIDTH),
)
def test_chosen_width_obeys_the_head_rules_and_prefers_powers_of_two(
    heads: int, kv_divisor: int, minimum: int
) -> None:
    kv = max(1, heads // kv_divisor) if heads % kv_divisor == 0 else heads
    shape = Shape(layers=1, attention_heads=heads, kv_heads=kv, head_dim=1)
    choice = choose_width(minimum, shape)
    candidates = [w for w in valid_widths(heads, kv) if w >= minimum]
    if not candidates:
        assert choice.width is None
        return
    assert choice.width is not None
    assert choice.width >= minimum
    assert heads % choice.width == 0
    assert kv % choice.width == 0 or choice.width % kv == 0
    powers = [w for w in candidates if is_power_of_two(w)]
    assert choice.width == (powers[0] if powers else candidates[0])
