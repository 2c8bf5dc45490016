"""Parse ``SIE_DEVICES`` into the worker's ordered device list.

Pure: callers pass the raw value and whether a GPU is visible.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

__all__ = ["DeviceError", "cuda_mask", "default_devices", "gpu_visible", "parse_devices"]

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
