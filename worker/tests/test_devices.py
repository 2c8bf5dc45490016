from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sie_worker.devices import DeviceError, core_list, core_sets, cuda_mask, parse_devices


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("cuda:0,cuda:1", ("cuda:0", "cuda:1")),
        (" cuda:0 , ,cuda:1,", ("cuda:0", "cuda:1")),
        ("cuda:1,cuda:0,cuda:1", ("cuda:1", "cuda:0")),
        ("CUDA:2", ("cuda:2",)),
        ("cuda", ("cuda:0",)),
        ("cpu", ("cpu",)),
        ("cpu:0,cpu:1", ("cpu:0", "cpu:1")),
    ],
)
def test_devices_are_trimmed_deduplicated_and_kept_in_order(
    raw: str, expected: tuple[str, ...]
) -> None:
    assert parse_devices(raw, gpu_visible=False) == expected


@pytest.mark.parametrize("raw", [None, "", " , "])
def test_unset_means_one_device_cuda_when_a_gpu_is_visible(raw: str | None) -> None:
    assert parse_devices(raw, gpu_visible=True) == ("cuda:0",)
    assert parse_devices(raw, gpu_visible=False) == ("cpu",)


def test_mixed_families_are_refused_naming_the_variable() -> None:
    with pytest.raises(DeviceError, match="SIE_DEVICES: mixes device families"):
        parse_devices("cuda:0,cpu", gpu_visible=True)


@pytest.mark.parametrize("raw", ["gpu0", "cuda:x", "cuda:-1", "tpu:0"])
def test_unknown_device_names_are_refused(raw: str) -> None:
    with pytest.raises(DeviceError, match="is not a device"):
        parse_devices(raw, gpu_visible=False)


def test_cuda_mask_lists_block_indices_and_hides_gpus_from_cpu_slots() -> None:
    assert cuda_mask(("cuda:2", "cuda:3")) == "2,3"
    assert cuda_mask(("cpu",)) == ""


# --- cpu devices as core sets -------------------------------------------------------------


def test_cpu_devices_split_the_containers_cores_into_contiguous_equal_sets() -> None:
    assert core_sets(("cpu:0", "cpu:1"), [0, 1]) == ((0,), (1,))
    assert core_sets(("cpu:0", "cpu:1"), [3, 2, 1, 0, 4]) == ((0, 1), (2, 3))  # 4 left over
    assert core_sets(("cpu:0", "cpu:1", "cpu:2"), range(2, 11)) == (
        (2, 3, 4),
        (5, 6, 7),
        (8, 9, 10),
    )


def test_cpu_alone_runs_on_every_core_and_cuda_devices_have_none() -> None:
    assert core_sets(("cpu",), [0, 1, 5]) == ((0, 1, 5),)
    assert core_sets(("cuda:0", "cuda:1"), [0, 1]) == ((), ())
    assert core_sets(("cpu:0",), []) == ((),)  # affinity unknown: no binding


@given(
    st.integers(min_value=1, max_value=16),
    st.sets(st.integers(min_value=0, max_value=255), min_size=1, max_size=64),
)
def test_core_sets_are_disjoint_ordered_and_cover_what_an_even_split_can(
    count: int, cpus: set[int]
) -> None:
    devices = tuple(f"cpu:{i}" for i in range(count))
    sets = core_sets(devices, cpus)
    assert len(sets) == count
    assert all(sets)
    flat = [c for cores in sets for c in cores]
    assert set(flat) <= cpus
    if count <= len(cpus):
        assert len(flat) == len(set(flat)) == (len(cpus) // count) * count
        assert flat == sorted(flat)  # contiguous, in device order
        assert {len(cores) for cores in sets} == {len(cpus) // count}
    else:  # more devices than cores: one core each, shared by neighbours
        assert all(len(cores) == 1 for cores in sets)
        assert set(flat) == cpus


@pytest.mark.parametrize(
    ("cores", "text"),
    [([0], "0"), ([0, 1, 2, 3], "0-3"), ([6, 0, 1, 3], "0-1,3,6"), ([1, 1, 2], "1-2"), ([], "")],
)
def test_core_lists_are_written_as_taskset_and_vllm_read_them(cores: list[int], text: str) -> None:
    assert core_list(cores) == text


@given(st.sets(st.integers(min_value=0, max_value=512), max_size=40))
def test_a_core_list_names_exactly_its_cores(cores: set[int]) -> None:
    parsed: set[int] = set()
    for part in filter(None, core_list(cores).split(",")):
        low, _, high = part.partition("-")
        parsed |= set(range(int(low), int(high or low) + 1))
    assert parsed == cores
