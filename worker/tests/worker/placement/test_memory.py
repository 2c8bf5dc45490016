"""Where device memory comes from: the fake budget, NVML, the cgroup, the machine."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest

from sie_worker.settings import Settings
from sie_worker.worker.placement.memory import (
    DeviceMemory,
    cgroup_memory_limit,
    device_memory,
    nvml_probe,
)

GIB = 2**30


def _settings(devices: str, **env: str) -> Settings:
    return Settings.from_env({"SIE_DEVICES": devices, **env}, gpu=False)


def test_the_fake_budget_gives_every_device_that_total_with_nothing_else_using_it() -> None:
    memory = device_memory(_settings("cuda:0,cuda:1", SIE_FAKE_MEMORY_BUDGET="80GiB"), {})
    assert memory.source == "budget"
    assert memory.totals == (80 * GIB, 80 * GIB)
    assert memory.budgets() == (int(80 * GIB * 0.95),) * 2
    assert memory.free_at_start(0, reserved_by_others=33 * GIB) == 47 * GIB


def test_the_pressure_threshold_sets_the_budget() -> None:
    settings = _settings(
        "cpu", SIE_FAKE_MEMORY_BUDGET="100GB", SIE_MEMORY_PRESSURE_THRESHOLD_PERCENT="80"
    )
    assert device_memory(settings, {}).budgets() == (80 * 10**9,)


@pytest.mark.parametrize("value", ["0", "101", "-3", "half", "nan"])
def test_a_threshold_outside_0_to_100_is_refused_naming_the_variable(value: str) -> None:
    with pytest.raises(ValueError, match="SIE_MEMORY_PRESSURE_THRESHOLD_PERCENT"):
        _settings("cpu", SIE_MEMORY_PRESSURE_THRESHOLD_PERCENT=value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("4GiB", 4 * GIB), ("32GB", 32 * 10**9), ("1073741824", GIB), ("512 MiB", 512 * 2**20)],
)
def test_the_fake_budget_reads_bytes_or_a_size_with_a_unit_as_sie_does(
    text: str, expected: int
) -> None:
    assert _settings("cpu", SIE_FAKE_MEMORY_BUDGET=text).fake_memory_budget == expected


def test_cpu_devices_split_the_cgroup_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    limit = tmp_path / "memory.max"
    limit.write_text("17179869184\n")
    monkeypatch.setattr("sie_worker.worker.placement.memory._CGROUP_FILES", (limit,))
    memory = device_memory(_settings("cpu:0,cpu:1"), {})
    assert memory.source == "cgroup"
    assert memory.totals == (8 * GIB, 8 * GIB)


def test_without_a_cgroup_limit_cpu_devices_split_the_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    unlimited = tmp_path / "memory.max"
    unlimited.write_text("max\n")
    monkeypatch.setattr("sie_worker.worker.placement.memory._CGROUP_FILES", (unlimited,))
    memory = device_memory(_settings("cpu"), {})
    assert memory.source == "machine"
    assert memory.totals[0] is not None
    assert memory.totals[0] > 0


@pytest.mark.parametrize(
    ("text", "expected"),
    [("max", None), ("9223372036854771712", None), ("2147483648", 2 * GIB), ("garbage", None)],
)
def test_cgroup_limits_v1_and_v2(tmp_path: Path, text: str, expected: int | None) -> None:
    path = tmp_path / "limit"
    path.write_text(text)
    assert cgroup_memory_limit([tmp_path / "missing", path]) == expected


def test_cuda_devices_without_nvml_have_unknown_memory() -> None:
    memory = device_memory(_settings("cuda:0,cuda:1"), {}, nvml=lambda indices, env: None)
    assert memory.source == "unknown"
    assert memory.totals == (None, None)
    assert memory.budgets() == (None, None)
    assert memory.free_at_start(0, 0) is None
    assert not memory.known


class _FakeNvml(types.ModuleType):
    """The calls of pynvml the worker makes, over two GPUs of 80 and 40 GiB."""

    class NVMLError(Exception):
        pass

    def __init__(self) -> None:
        super().__init__("pynvml")
        self.free = {0: 70 * GIB, 1: 39 * GIB, 2: 10 * GIB}
        self.totals = {0: 80 * GIB, 1: 40 * GIB, 2: 24 * GIB}
        self.uuids = {"GPU-aaaa": 2}

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if index not in self.totals:
            raise self.NVMLError("Invalid Argument")
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        return self.uuids[uuid]

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        return types.SimpleNamespace(total=self.totals[handle], free=self.free[handle])


def test_nvml_gives_totals_and_measures_free_memory_at_each_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = _FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    memory = device_memory(_settings("cuda:0,cuda:1"), {})
    assert memory.source == "nvml"
    assert memory.totals == (80 * GIB, 40 * GIB)
    assert memory.free_at_start(0, reserved_by_others=0) == 70 * GIB
    fake.free[0] = 12 * GIB  # another engine took memory meanwhile
    assert memory.free_at_start(0, reserved_by_others=0) == 12 * GIB


def test_nvml_follows_the_workers_own_device_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _FakeNvml())
    probe = nvml_probe([0, 1], {"CUDA_VISIBLE_DEVICES": "2,0"})
    assert probe is not None
    assert probe[0] == [24 * GIB, 80 * GIB]
    probe = nvml_probe([0], {"CUDA_VISIBLE_DEVICES": "GPU-aaaa"})
    assert probe is not None
    assert probe[0] == [24 * GIB]


def test_an_nvml_failure_leaves_memory_unknown(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _FakeNvml())
    assert nvml_probe([7], {}) is None
    assert "each device takes one model" in caplog.text


def test_a_failing_free_reading_falls_back_to_the_arithmetic() -> None:
    def broken(index: int) -> int:
        raise RuntimeError("GPU is lost")

    memory = DeviceMemory("nvml", (80 * GIB,), measure=broken)
    assert memory.free_at_start(0, reserved_by_others=30 * GIB) == 50 * GIB
