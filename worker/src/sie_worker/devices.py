"""Parse ``SIE_DEVICES`` into the worker's ordered device list, and give cpu devices their
cores.

CPU devices are core sets: ``cpu:0..cpu:N-1`` split the container's CPUs (its affinity,
sorted) into N contiguous sets of equal size, in the order the devices are listed (cores
left over by an uneven split belong to no device; with more devices than CPUs, each device
gets one core and neighbours share it); ``cpu`` alone is all of them. An engine on a block of
cpu devices runs on their cores.

Pure: callers pass the raw value, whether a GPU is visible, and the container's CPUs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

__all__ = [
    "DeviceError",
    "core_list",
    "core_sets",
    "cuda_mask",
    "default_devices",
    "gpu_visible",
    "parse_devices",
]

_DEVICE = re.compile(r"^(cuda|cpu)(?::(\d+))?$")


class DeviceError(ValueError):
    """``SIE_DEVICES`` cannot be used; the message names the variable and the fix."""


def parse_devices(raw: str | None, *, gpu_visible: bool) -> tuple[str, ...]:
    """Return the device list: items trimmed, empties dropped, duplicates removed, order kept.

    Unset or empty means one device: ``cuda:0`` when a GPU is visible, else ``cpu``.
    ``cuda`` alone means ``cuda:0``; ``cpu`` and ``cpu:N`` are CPU slots. Mixing families
    (``cuda:0,cpu``) is refused.
    """
    if raw is None or not raw.strip():
        return default_devices(gpu_visible=gpu_visible)
    seen: list[str] = []
    families: set[str] = set()
    for item in raw.split(","):
        name = item.strip().lower()
        if not name:
            continue
        match = _DEVICE.match(name)
        if match is None:
            raise DeviceError(
                f"SIE_DEVICES: {item.strip()!r} is not a device; "
                "use a comma list such as cuda:0,cuda:1 (or cpu)"
            )
        family, index = match.group(1), match.group(2)
        canonical = "cpu" if family == "cpu" and index is None else f"{family}:{int(index or 0)}"
        families.add(family)
        if canonical not in seen:
            seen.append(canonical)
    if not seen:
        return default_devices(gpu_visible=gpu_visible)
    if len(families) > 1:
        raise DeviceError(
            f"SIE_DEVICES: mixes device families ({', '.join(seen)}); "
            "list only cuda:N devices or only cpu"
        )
    return tuple(seen)


def default_devices(*, gpu_visible: bool) -> tuple[str, ...]:
    return ("cuda:0",) if gpu_visible else ("cpu",)


def gpu_visible() -> bool:
    """Whether an NVIDIA GPU is visible to this container, without importing CUDA libraries."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    gpus = Path("/proc/driver/nvidia/gpus")
    try:
        return gpus.is_dir() and any(gpus.iterdir())
    except OSError:
        return False


def cuda_mask(devices: tuple[str, ...] | list[str]) -> str:
    """``CUDA_VISIBLE_DEVICES`` for a block: cuda:2,cuda:3 -> ``2,3``; CPU slots hide every GPU."""
    indices = [d.split(":", 1)[1] for d in devices if d.startswith("cuda:")]
    return ",".join(indices)


def core_sets(devices: tuple[str, ...], cpus: Iterable[int]) -> tuple[tuple[int, ...], ...]:
    """The cores of each device (``()`` for a cuda device, and for all when ``cpus`` is
    empty): see the module docstring."""
    available = sorted(set(cpus))
    cpu_devices = [d for d in devices if d.startswith("cpu")]
    if not cpu_devices or not available:
        return tuple(() for _ in devices)
    if cpu_devices == ["cpu"]:
        return tuple(tuple(available) if d == "cpu" else () for d in devices)
    count, size = len(cpu_devices), len(available) // len(cpu_devices)
    sets = {
        device: (
            tuple(available[i * size : (i + 1) * size])
            if size
            else (available[i * len(available) // count],)
        )
        for i, device in enumerate(cpu_devices)
    }
    return tuple(sets.get(d, ()) for d in devices)


def core_list(cores: Iterable[int]) -> str:
    """``0-3,6`` for cores 0, 1, 2, 3 and 6 (the form taskset and vLLM read)."""
    ordered = sorted(set(cores))
    parts: list[str] = []
    start = previous = None
    for core in [*ordered, None]:
        if core is not None and previous is not None and core == previous + 1:
            previous = core
            continue
        if start is not None:
            parts.append(str(start) if start == previous else f"{start}-{previous}")
        start = previous = core
    return ",".join(parts)
