"""The per-request / per-event fit of tests/bench/bench_hop_cost.py."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.bench.bench_hop_cost import fit, idle_ms_per_s


@given(
    per_request=st.floats(0, 5000),
    per_event=st.floats(0, 200),
    cells=st.lists(
        st.tuples(st.integers(1, 5000), st.integers(1, 500)),
        min_size=2,
        max_size=6,
        unique_by=lambda c: c[1],
    ),
)
def test_the_fit_recovers_both_costs_from_cells_of_different_stream_lengths(
    per_request: float, per_event: float, cells: list[tuple[int, int]]
) -> None:
    rows = [(float(n), float(n * k), per_request * n + per_event * n * k) for n, k in cells]
    got_request, got_event = fit(rows)
    assert got_request == pytest.approx(per_request, rel=1e-6, abs=1e-6)
    assert got_event == pytest.approx(per_event, rel=1e-6, abs=1e-6)


def test_cells_of_one_stream_length_cannot_tell_the_costs_apart() -> None:
    with pytest.raises(ValueError, match="differ in events per request"):
        fit([(10.0, 520.0, 1.0), (20.0, 1040.0, 2.0)])


def test_idle_cpu_is_milliseconds_of_cpu_per_second_of_wall_time() -> None:
    assert idle_ms_per_s(1.0, 1.05, 10.0) == pytest.approx(5.0)
    with pytest.raises(ValueError, match="longer than 0 s"):
        idle_ms_per_s(1.0, 1.05, 0.0)
