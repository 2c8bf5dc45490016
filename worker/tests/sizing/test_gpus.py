from __future__ import annotations

import pytest

from sie_worker.sizing.gpus import GPU_MEMORY_BYTES, GpuError, gpu_memory_for_type, parse_memory


@pytest.mark.parametrize(
    ("gpu_type", "gb"),
    [("l4", 24), ("a10g", 24), ("a100-40gb", 40), ("a100-80gb", 80), ("h100", 80), ("h200", 141)],
)
def test_gpu_types_map_to_data_sheet_gb(gpu_type: str, gb: int) -> None:
    assert gpu_memory_for_type(gpu_type) == gb * 10**9


def test_gpu_type_is_case_insensitive() -> None:
    assert gpu_memory_for_type("H100") == gpu_memory_for_type("h100")


def test_unknown_gpu_type_lists_the_known_ones() -> None:
    with pytest.raises(GpuError) as info:
        gpu_memory_for_type("a100")
    message = str(info.value)
    assert all(name in message for name in GPU_MEMORY_BYTES)
    assert "--gpu-memory" in message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("80GB", 80 * 10**9),
        ("80", 80 * 10**9),
        ("141 GB", 141 * 10**9),
        ("80GiB", 80 * 2**30),
        ("80Gi", 80 * 2**30),
        ("81920MiB", 80 * 2**30),
        ("8e10B", 80 * 10**9),
        ("0.5TB", 500 * 10**9),
    ],
)
def test_memory_sizes_read_decimal_and_binary_units(text: str, expected: int) -> None:
    assert parse_memory(text) == expected


@pytest.mark.parametrize("text", ["eighty", "80 GBs", "", "0GB", "-5GB"])
def test_unreadable_memory_size_says_how_to_write_one(text: str) -> None:
    with pytest.raises(GpuError, match=r"e\.g\. 80GB"):
        parse_memory(text)
