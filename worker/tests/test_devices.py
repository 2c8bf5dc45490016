from __future__ import annotations

import pytest

from sie_worker.devices import DeviceError, cuda_mask, parse_devices


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
