"""The width rule shared by the load-time head check and ``sie-worker size``."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sie_worker.config.rules import MAX_WIDTH, valid_widths, width_fits_heads


def test_width_rule_rejects_widths_outside_1_to_8() -> None:
    assert not width_fits_heads(0, 64, 8)
    assert not width_fits_heads(16, 64, 8)
    assert width_fits_heads(8, 64, 8)


def test_fourteen_heads_with_two_kv_heads_fit_widths_1_and_2() -> None:
    assert valid_widths(14, 2) == (1, 2)


@given(heads=st.integers(1, 512), kv=st.integers(1, 512), width=st.integers(-2, 12))
def test_a_width_fits_when_it_divides_the_heads_and_meets_the_kv_heads(
    heads: int, kv: int, width: int
) -> None:
    expected = (
        1 <= width <= MAX_WIDTH and heads % width == 0 and (kv % width == 0 or width % kv == 0)
    )
    assert width_fits_heads(width, heads, kv) is expected
    assert (width in valid_widths(heads, kv)) is expected
