"""llama.cpp's layer placement over a split, against seed 004's Example 11 and its rule."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sie_worker.engines.llamacpp.split import CPU, layer_ranges, layer_split


def _text(n_layer: int, ngl: int, proportions: list[float]) -> str:
    ranges, output = layer_ranges(n_layer, ngl, proportions)
    where = "CPU" if output == CPU else f"GPU{output}"
    return ", ".join(map(str, ranges)) + f", output on {where}"


@pytest.mark.parametrize(
    ("ngl", "proportions", "expected"),
    [
        (99, [1, 1], "GPU0 layers 0-16 (17), GPU1 layers 17-31 (15), output on GPU1"),
        (99, [3, 1], "GPU0 layers 0-24 (25), GPU1 layers 25-31 (7), output on GPU1"),
        (99, [22, 10], "GPU0 layers 0-22 (23), GPU1 layers 23-31 (9), output on GPU1"),
        (
            20,
            [1, 1],
            "CPU layers 0-12 (13), GPU0 layers 13-22 (10), GPU1 layers 23-31 (9), output on GPU1",
        ),
        (
            99,
            [1, 1, 1],
            "GPU0 layers 0-10 (11), GPU1 layers 11-21 (11), GPU2 layers 22-31 (10), output on GPU2",
        ),
    ],
)
def test_the_seeds_examples_place_a_32_layer_model_as_llama_cpp_does(
    ngl: int, proportions: list[float], expected: str
) -> None:
    assert _text(32, ngl, proportions) == expected


@given(
    n_layer=st.integers(1, 200),
    ngl=st.integers(0, 300),
    proportions=st.lists(st.integers(0, 50), min_size=1, max_size=8).filter(any),
)
def test_every_unit_lands_once_in_device_order_with_the_first_layers_on_the_cpu(
    n_layer: int, ngl: int, proportions: list[int]
) -> None:
    where = layer_split(n_layer, ngl, proportions)
    assert len(where) == n_layer + 1
    offloaded = min(ngl, n_layer + 1)
    assert where.count(CPU) == n_layer + 1 - offloaded  # partial offload keeps the first
    assert all(d == CPU for d in where[: n_layer + 1 - offloaded])
    devices = [d for d in where if d != CPU]
    assert devices == sorted(devices)  # contiguous runs, in device order
    assert all(proportions[d] > 0 for d in devices)  # a device of proportion 0 gets nothing


def test_bad_proportions_are_refused() -> None:
    with pytest.raises(ValueError, match="proportion"):
        layer_split(32, 99, [0, 0])
