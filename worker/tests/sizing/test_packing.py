"""Which single-GPU models share a GPU, and the shares the worker gives them."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from sie_worker.sizing.memory_needs import GIB, memory_need, sglang_fraction
from sie_worker.sizing.packing import Tenant, pack, seat_for, suggest_fraction

H100 = 80 * 10**9


def _chat(name: str, need_gb: float, fraction: float | None = None) -> Tenant:
    return Tenant(name, "sglang", 1, need_gb * 1e9, need_gb * 0.6e9, declared_fraction=fraction)


def test_the_suggested_fraction_holds_the_need_rounded_up_to_a_hundredth() -> None:
    assert suggest_fraction(20.3e9, H100) == 0.26
    assert suggest_fraction(24e9, H100) == 0.30
    assert suggest_fraction(500e9, H100) == 0.99


def test_a_declared_fraction_is_kept_and_a_short_one_is_flagged() -> None:
    seat = seat_for(_chat("a", 24.0, fraction=0.2), H100)
    assert (seat.fraction, seat.suggested) == (0.2, False)
    assert seat.reserved_bytes == memory_need("sglang", H100, mem_fraction=0.2)
    assert math.isclose(seat.short_bytes, 8e9)
    assert seat_for(_chat("b", 24.0), H100).short_bytes == 0


def test_small_models_share_gpus_first_fit_by_decreasing_reservation() -> None:
    tenants = [_chat("a", 20.3), _chat("b", 30.0), _chat("c", 40.0), _chat("d", 15.0)]
    packing = pack(tenants, H100)
    names = [[s.name for s in gpu] for gpu in packing.gpus]
    # c (41 GB) + b (31 GB) fit the 76 GB budget; a and d do not fit beside them.
    assert names == [["c", "b"], ["a", "d"]]
    assert (packing.gpus_shared, packing.gpus_exclusive) == (2, 4)


def test_the_shares_are_what_the_worker_passes_in_that_load_order() -> None:
    packing = pack([_chat("a", 32.0, 0.4), _chat("b", 32.0, 0.4)], H100)
    first, second = packing.gpus[0]
    assert first.share == 0.4
    assert second.share == sglang_fraction(H100, H100 - first.reserved_bytes, 0.4)


def test_vllm_models_reserve_their_utilization_of_the_gpu_and_keep_it_as_their_share() -> None:
    vllm = [
        Tenant("v1", "vllm", 1, 30e9, 16e9, declared_fraction=0.45),
        Tenant("v2", "vllm", 1, 20.3e9, 16e9),
    ]
    packing = pack([*vllm, _chat("s", 10.0)], H100)
    seats = {s.name: s for gpu in packing.gpus for s in gpu}
    assert (seats["v1"].fraction, seats["v1"].suggested) == (0.45, False)
    assert seats["v1"].reserved_bytes == memory_need("vllm", H100, mem_fraction=0.45)
    assert (seats["v2"].fraction, seats["v2"].suggested) == (0.26, True)
    # vLLM reads its fraction of the total: it gets it unchanged, whatever was placed first.
    assert (seats["v1"].share, seats["v2"].share) == (0.45, 0.26)
    assert all(s.engine == "vllm" for s in (seats["v1"], seats["v2"]))


def test_groups_claim_whole_gpus_and_unplaceable_models_are_named() -> None:
    tenants = [
        _chat("small", 10.0),
        Tenant("big", "sglang", 4, 200e9, 141e9),
        Tenant("huge", "sglang", None, 2000e9, 1000e9),
    ]
    packing = pack(tenants, H100)
    assert packing.groups == (("big", 4),)
    assert packing.unplaceable == ("huge",)
    assert packing.gpus_shared == 5
    assert packing.gpus_exclusive == 5


def test_the_default_engine_reserves_its_weights_and_caps_cuda() -> None:
    embed = Tenant("embed", "transformers", 1, 0.2e9, 0.09e9)
    seat = pack([embed], H100).gpus[0][0]
    assert seat.fraction is None
    assert seat.reserved_bytes == math.ceil(0.09e9 * 1.2) + GIB
    assert seat.share is not None
    assert 0 < seat.share < 0.1
    declared = Tenant("embed", "transformers", 1, 0.2e9, 0.09e9, declared_memory_gib=3)
    assert seat_for(declared, H100).reserved_bytes == 3 * GIB


def test_a_lower_threshold_puts_fewer_models_on_a_gpu() -> None:
    tenants = [_chat("a", 30.0), _chat("b", 30.0)]
    assert len(pack(tenants, H100, 95).gpus) == 1
    assert len(pack(tenants, H100, 70).gpus) == 2


@given(
    st.lists(st.floats(0.5, 90.0), min_size=1, max_size=20),
    st.sampled_from([24 * 10**9, 80 * 10**9, 141 * 10**9]),
    st.floats(50, 100),
)
def test_no_gpu_is_over_its_budget_and_every_model_has_a_seat(
    needs_gb: list[float], memory: int, threshold: float
) -> None:
    tenants = [_chat(f"m{i}", need) for i, need in enumerate(needs_gb)]
    packing = pack(tenants, memory, threshold)
    seated = sorted(s.name for gpu in packing.gpus for s in gpu)
    assert seated == sorted(t.name for t in tenants)
    for gpu in packing.gpus:
        if len(gpu) > 1:
            assert sum(s.reserved_bytes for s in gpu) <= packing.budget_bytes
    assert packing.gpus_shared <= packing.gpus_exclusive
