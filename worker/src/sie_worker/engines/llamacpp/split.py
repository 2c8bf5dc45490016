"""Where llama.cpp puts each layer of a model split over several devices (seed 004, Example
11: the split-point code of ``llama_model_base::load_tensors`` at llama.cpp 0c1e57098). Pure.

1. The proportions (``-ts``, else each device's free memory) become normalized running sums:
   ``3,1`` gives the split points 0.75 and 1.0.
2. The output layer counts as layer ``n_layer``: ``n_layer + 1`` units in all.
3. Only the last ``-ngl`` units go to the devices; the others stay on the CPU.
4. Unit ``il`` goes to the first device whose split point is above
   ``(il - first offloaded unit) / offloaded units`` (``std::upper_bound``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["CPU", "LayerRange", "layer_ranges", "layer_split"]

CPU = -1  # the device index of units left on the CPU


@dataclass(frozen=True)
class LayerRange:
    """A run of consecutive repeating layers on one device (``CPU``: not offloaded)."""

    device: int
    first: int
    last: int

    @property
    def count(self) -> int:
        return self.last - self.first + 1

    def __str__(self) -> str:
        where = "CPU" if self.device == CPU else f"GPU{self.device}"
        return f"{where} layers {self.first}-{self.last} ({self.count})"


def layer_split(n_layer: int, ngl: int, proportions: Sequence[float]) -> list[int]:
    """The device of each unit ``0..n_layer`` (the last is the output layer): an index into
    ``proportions``, or :data:`CPU`. ``ngl`` above ``n_layer`` offloads every unit."""
    if n_layer < 1 or not proportions or any(p < 0 for p in proportions):
        raise ValueError("needs at least one layer and non-negative proportions")
    total = float(sum(proportions))
    if total <= 0:
        raise ValueError("needs a proportion above 0")
    points, running = [], 0.0
    for p in proportions:
        running += p
        points.append(running / total)
    units = n_layer + 1
    offloaded = min(max(ngl, 0), units)
    first = units - offloaded
    where = []
    for il in range(units):
        if il < first:
            where.append(CPU)
            continue
        x = (il - first) / offloaded
        device = next((g for g, point in enumerate(points) if point > x), len(points) - 1)
        where.append(device)
    return where


def layer_ranges(
    n_layer: int, ngl: int, proportions: Sequence[float]
) -> tuple[list[LayerRange], int]:
    """The repeating layers as runs per device, and the output layer's device."""
    where = layer_split(n_layer, ngl, proportions)
    ranges: list[LayerRange] = []
    for il, device in enumerate(where[:n_layer]):
        if ranges and ranges[-1].device == device:
            ranges[-1] = LayerRange(device, ranges[-1].first, il)
        else:
            ranges.append(LayerRange(device, il, il))
    return ranges, where[n_layer]
