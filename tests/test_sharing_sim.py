"""The simulated day of tests/bench/bench_sharing.py counts what the worker would do."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.bench.bench_sharing import GPU_BYTES, MIN_FRACTION, day_trace, small_models
from tests.bench.sharing_sim import APPROACHES, Approach, Request, SimModel, simulate


def _models(*needs: int, load_s: float = 10.0) -> list[SimModel]:
    return [SimModel(chr(ord("a") + i), need, load_s) for i, need in enumerate(needs)]


def _trace(*events: tuple[float, str]) -> list[Request]:
    return [Request(at, model) for at, model in events]


def test_exclusive_claims_load_one_model_per_gpu_and_defer_a_load_while_every_gpu_loads() -> None:
    # a and b load on the two GPUs; c finds both loading and waits for a (ready at 10),
    # evicts it and is ready at 20; a comes back at 20 and evicts b (used at 11) not c (20).
    trace = _trace((0, "a"), (1, "b"), (2, "c"), (20, "a"))
    day = simulate(_models(40, 40, 40), trace, 2, "exclusive", gpu_bytes=100)
    assert day.loads == 4
    assert day.loads_by_model == {"a": 2, "b": 1, "c": 1}
    assert day.deferred_loads == 1
    assert sorted(day.waits_s) == [10, 10, 10, 18]
    assert day.peak_models == (1, 1)
    assert day.budget_bytes is None


def test_sharing_puts_models_on_one_gpu_while_they_fit_and_serializes_their_starts() -> None:
    # Budget 95 of 100: a and b (40 each) share the GPU, b's start waits for a's (ready at
    # 10, b at 20); c does not fit beside both and evicts a, the least recently used.
    trace = _trace((0, "a"), (1, "b"), (25, "b"), (30, "c"), (45, "b"))
    day = simulate(_models(40, 40, 40), trace, 1, "spread", gpu_bytes=100)
    assert day.loads == 3
    assert day.waited == 3
    assert sorted(day.waits_s) == [10, 10, 19]
    assert day.budget_bytes == 95
    assert day.peak_reserved_bytes == day.peak_shared_bytes == (80,)
    assert day.peak_models == (2,)


def test_requests_for_a_ready_model_do_not_wait_and_keep_it_from_eviction() -> None:
    # a and b share the GPU; a is used again at 50, so c evicts b, not a.
    trace = _trace((0, "a"), (0, "b"), (50, "a"), (60, "c"), (61, "a"))
    day = simulate(_models(40, 40, 40), trace, 1, "pack", gpu_bytes=100)
    assert day.loads_by_model == {"a": 1, "b": 1, "c": 1}
    assert day.waited == 3  # a, b and c; a's later requests find it ready


def test_exclusive_loads_fall_to_one_per_model_once_every_model_has_a_gpu() -> None:
    sized = small_models()
    trace, _ = day_trace(sized, 2000, seed=1)
    day = simulate([s.model for s in sized], trace, len(sized), "exclusive", gpu_bytes=GPU_BYTES)
    assert day.loads == len({r.model for r in trace})


def test_the_day_is_deterministic_in_time_order_and_sized_as_documented() -> None:
    sized = small_models()
    first, shares = day_trace(sized, 5000, seed=3)
    again, _ = day_trace(sized, 5000, seed=3)
    assert first == again
    assert [r.at for r in first] == sorted(r.at for r in first)
    assert all(0 <= r.at < 86400 for r in first)
    assert abs(sum(shares.values()) - 1) < 1e-9
    assert len(sized) == 20
    assert all(MIN_FRACTION <= s.fraction <= 0.5 for s in sized)


@settings(max_examples=200, deadline=None)
@given(
    needs=st.lists(st.integers(1, 120), min_size=1, max_size=6),
    gpus=st.integers(1, 3),
    approach=st.sampled_from(APPROACHES),
    events=st.lists(st.tuples(st.floats(0, 200), st.integers(0, 5)), max_size=40),
)
def test_a_gpu_never_holds_more_than_its_budget_and_every_request_is_served(
    needs: list[int], gpus: int, approach: Approach, events: list[tuple[float, int]]
) -> None:
    models = _models(*needs, load_s=7.0)
    trace = sorted(
        (Request(at, models[i % len(models)].name) for at, i in events), key=lambda r: r.at
    )
    day = simulate(models, trace, gpus, approach, gpu_bytes=100)
    # A model alone on a GPU may need more than its budget; models sharing one never do.
    assert all(shared <= 95 for shared in day.peak_shared_bytes)
    if approach == "exclusive":
        assert all(held <= 1 for held in day.peak_models)
        assert day.peak_shared_bytes == (0,) * gpus
    assert day.loads == sum(day.loads_by_model.values())
    assert day.loads >= len({r.model for r in trace})
    assert day.waited <= len(trace)
    assert all(w >= 0 for w in day.waits_s)
