"""GPU types and memory sizes for capacity planning (``sie-worker size``).

Units: every size here is in bytes, and "GB" means 10**9 bytes, as in the vendors' data
sheets ("one 80 GB GPU, 90% usable" is ``80e9 * 0.9`` bytes).
The table holds the nominal data-sheet figure; a real card usually reports a little more
(an H100 80 GB shows about 85.0e9 bytes), so plans made from it err on the safe side.
``GiB`` (2**30 bytes) is accepted on input and used only for Kubernetes quantities.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType

__all__ = [
    "GB",
    "GPU_MEMORY_BYTES",
    "GpuError",
    "gpu_memory_for_type",
    "known_types",
    "parse_memory",
]

GB = 10**9

# Nominal memory per GPU, bytes (data-sheet GB = 1e9 bytes). Keys are the chart's
# `gpuType` spellings: lowercase, size suffix where one name covers two sizes.
GPU_MEMORY_BYTES: Mapping[str, int] = MappingProxyType(
    {
        "t4": 16 * GB,
        "l4": 24 * GB,
        "a10g": 24 * GB,
        "a10": 24 * GB,
        "l40s": 48 * GB,
        "a100-40gb": 40 * GB,
        "a100-80gb": 80 * GB,
        "h100": 80 * GB,
        "h100-nvl": 94 * GB,
        "h200": 141 * GB,
        "b200": 180 * GB,
        "mi300x": 192 * GB,
    }
)

_UNITS: Mapping[str, int] = MappingProxyType(
    {
        "": GB,  # a bare number means GB, the unit GPU data sheets use
        "b": 1,
        "kb": 10**3,
        "mb": 10**6,
        "gb": GB,
        "tb": 10**12,
        "k": 10**3,
        "m": 10**6,
        "g": GB,
        "t": 10**12,
        "kib": 2**10,
        "mib": 2**20,
        "gib": 2**30,
        "tib": 2**40,
        "ki": 2**10,
        "mi": 2**20,
        "gi": 2**30,
        "ti": 2**40,
    }
)
_MEMORY_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


class GpuError(ValueError):
    """An unknown GPU type or an unreadable memory size; the message says what is accepted."""


def known_types() -> str:
    """The table as ``l4 (24 GB), ...`` for error messages and help."""
    return ", ".join(f"{name} ({size / GB:g} GB)" for name, size in GPU_MEMORY_BYTES.items())


def gpu_memory_for_type(gpu_type: str) -> int:
    """Bytes of memory of one GPU of ``gpu_type`` (case-insensitive), else :class:`GpuError`."""
    key = gpu_type.strip().lower()
    if key in GPU_MEMORY_BYTES:
        return GPU_MEMORY_BYTES[key]
    raise GpuError(
        f"unknown GPU type {gpu_type!r}; known types: {known_types()}. "
        "For another GPU pass its memory instead, e.g. --gpu-memory 96GB"
    )


def parse_memory(text: str, *, bare_unit: int = GB) -> int:
    """Bytes from ``80GB``, ``80``, ``141 GB``, ``80GiB``, ``81920MiB`` or ``8e10B``.

    A bare number is ``bare_unit`` bytes: GB (1e9 bytes) by default, as on data sheets;
    ``Gi``/``GiB`` are 2**30 bytes.
    """
    match = _MEMORY_RE.match(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        bare = "GB" if bare_unit == GB else "bytes" if bare_unit == 1 else f"{bare_unit} bytes"
        raise GpuError(
            f"cannot read memory size {text!r}; write a number with a unit, e.g. 80GB "
            f"(1e9 bytes), 80GiB (2**30 bytes) or 81920MiB; a bare number means {bare}"
        )
    value = float(match.group(1)) * (_UNITS[unit] if unit else bare_unit)
    if value <= 0:
        raise GpuError(f"memory size {text!r} must be above zero, e.g. 80GB")
    return int(value)
