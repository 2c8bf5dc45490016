"""Device memory: each device's total, its budget, and what is free when an engine starts.

Where the figures come from (DESIGN "Device memory"):

- ``SIE_FAKE_MEMORY_BUDGET`` (SIE's name; tests, ``sie-worker plan``): every device has that
  total and nothing else uses it, so the memory free on a device is its total minus the
  needs reserved there.
- ``cuda:N``: NVML (``nvidia-ml-py``), which reads the driver without creating a CUDA
  context in the worker. ``cuda:N`` is the N-th GPU the worker's own
  ``CUDA_VISIBLE_DEVICES`` shows (indices or UUIDs), else NVML's N-th. Free memory is
  measured when an engine starts, because SGLang takes its fraction of what is free then.
- ``cpu`` / ``cpu:N``: the container's memory limit (cgroup v2 ``memory.max``, else v1
  ``memory.limit_in_bytes``), else the machine's memory, split evenly between the CPU
  devices; free is the total minus what is reserved.
- Anything else (no NVML driver, an unreadable GPU): unknown, and placement keeps one model
  per device.

One interface for every source (:class:`DeviceMemory`): placement never knows which one it
reads.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sie_worker.settings import Settings

__all__ = ["DeviceMemory", "cgroup_memory_limit", "device_memory", "nvml_probe"]

_log = logging.getLogger("sie_worker.memory")
_CGROUP_FILES = (
    Path("/sys/fs/cgroup/memory.max"),  # cgroup v2
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),  # cgroup v1
)
# cgroup v1 reports "no limit" as a huge number near 2**63.
_NO_LIMIT = 2**60

FreeProbe = Callable[[int], int | None]


@dataclass(frozen=True)
class DeviceMemory:
    """The memory of the worker's devices, as placement and engine starts read it.

    ``totals`` has one entry per device (None: unknown); ``measure`` reads a device's free
    bytes now (NVML), or is None where free memory is the total minus what is reserved.
    """

    source: str  # "budget", "nvml", "cgroup", "machine" or "unknown"
    totals: tuple[int | None, ...]
    threshold_percent: float = 95.0
    measure: FreeProbe | None = None

    @property
    def known(self) -> bool:
        return any(t is not None for t in self.totals)

    def budgets(self) -> tuple[int | None, ...]:
        """Each device's budget: its total x the pressure threshold (None: unknown)."""
        return tuple(self.budget(i) for i in range(len(self.totals)))

    def budget(self, index: int) -> int | None:
        total = self.totals[index]
        return None if total is None else math.floor(total * self.threshold_percent / 100)

    def free_at_start(self, index: int, reserved_by_others: int) -> int | None:
        """The bytes free on a device for an engine starting now: measured (NVML), else its
        total minus what the other models there reserve."""
        total = self.totals[index]
        if total is None:
            return None
        if self.measure is not None:
            try:
                measured = self.measure(index)
            except Exception as exc:  # a device that stops answering: fall back to arithmetic
                _log.warning("cannot read the free memory of device %d: %s", index, exc)
                measured = None
            if measured is not None:
                return measured
        return max(total - reserved_by_others, 0)


def device_memory(
    settings: Settings,
    env: Mapping[str, str] | None = None,
    *,
    nvml: Callable[[Sequence[int], Mapping[str, str]], tuple[list[int], FreeProbe] | None]
    | None = None,
) -> DeviceMemory:
    """The memory of ``settings.devices`` from the first source that knows it."""
    env = os.environ if env is None else env
    devices = settings.devices
    threshold = settings.memory_pressure_threshold_percent
    if settings.fake_memory_budget is not None:
        totals = (settings.fake_memory_budget,) * len(devices)
        return DeviceMemory("budget", totals, threshold)
    if all(d.startswith("cuda:") for d in devices):
        probe = (nvml or nvml_probe)([int(d.split(":", 1)[1]) for d in devices], env)
        if probe is None:
            return DeviceMemory("unknown", (None,) * len(devices), threshold)
        totals_nvml, measure = probe
        return DeviceMemory("nvml", tuple(totals_nvml), threshold, measure)
    limit = cgroup_memory_limit()
    source, total = ("cgroup", limit) if limit is not None else ("machine", _machine_memory())
    if total is None:
        return DeviceMemory("unknown", (None,) * len(devices), threshold)
    share = total // len(devices)
    return DeviceMemory(source, (share,) * len(devices), threshold)


def cgroup_memory_limit(files: Sequence[Path] | None = None) -> int | None:
    """The container's memory limit in bytes, or None where there is none."""
    for path in _CGROUP_FILES if files is None else files:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text == "max":
            return None
        try:
            value = int(text)
        except ValueError:
            continue
        return value if 0 < value < _NO_LIMIT else None
    return None


def _machine_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None


def nvml_probe(
    indices: Sequence[int], env: Mapping[str, str]
) -> tuple[list[int], FreeProbe] | None:
    """Totals of ``cuda:<index>`` devices and a reader of their free memory, from NVML;
    None (logged once) where NVML cannot be used."""
    try:
        import pynvml
    except ImportError:  # pragma: no cover - a dependency of the worker
        return None
    try:
        pynvml.nvmlInit()
        handles = [_handle(pynvml, i, env) for i in indices]
        totals = [int(pynvml.nvmlDeviceGetMemoryInfo(h).total) for h in handles]
    except (pynvml.NVMLError, ValueError, IndexError) as exc:
        _log.warning(
            "device memory is unknown (NVML: %s); each device takes one model, as without "
            "memory accounting (set SIE_FAKE_MEMORY_BUDGET to give every device a budget)",
            exc,
        )
        return None

    def free(index: int) -> int:
        return int(pynvml.nvmlDeviceGetMemoryInfo(handles[index]).free)

    return totals, free


def _handle(pynvml: Any, index: int, env: Mapping[str, str]) -> Any:
    """The NVML handle of ``cuda:<index>``: the worker's CUDA_VISIBLE_DEVICES entry (an
    index or a UUID) at that position, else NVML's device of that index."""
    mask = env.get("CUDA_VISIBLE_DEVICES")
    if mask is None or not mask.strip():
        return pynvml.nvmlDeviceGetHandleByIndex(index)
    entries = [e.strip() for e in mask.split(",") if e.strip()]
    entry = entries[index]
    if entry.isdigit():
        return pynvml.nvmlDeviceGetHandleByIndex(int(entry))
    return pynvml.nvmlDeviceGetHandleByUUID(entry)
