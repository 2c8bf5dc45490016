"""The GPU check's memory part: two default-engine models on one device (see gpu_check.py).

With both models loaded on one device of known memory (NVML on CUDA; the container's or
machine's memory on ``cpu``), checks that:

- they share it: ``/v1/models`` has both ready there, ``/v1/devices`` lists both, its
  ``memory_reserved_bytes`` is the sum of their ``memory_bytes`` and within the budget;
- each reservation follows the rule (``memory_need``): the declared ``memory_gib``, or the
  weight files x 1.2 + 1 GiB;
- on CUDA, the device total is the GPU's (``nvidia-smi --query-gpu=memory.total``), each
  engine was started with ``--cuda-memory-fraction`` = ``cuda_cap(memory_bytes, total)``,
  ``nvidia-smi --query-compute-apps=pid,used_memory`` shows each engine within its
  reservation and no CUDA context in the worker process, and torch's allocator refuses to
  grow past such a cap (``cap_cuda_memory``, in a separate process).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sie_worker.sizing.memory_needs import cuda_cap, memory_need
from sie_worker.worker.weights.on_disk import weight_bytes

__all__ = ["GIB", "gpu_apps", "memory_checks", "smi"]

GIB = 2**30
MIB = 2**20
SRC = Path(__file__).resolve().parents[2] / "worker" / "src"
Check = Callable[[str, Callable[[], str]], bool]
Http = Callable[..., Any]
EngineOf = Callable[[str], tuple[int, int]]

# Run in a fresh process, so that this check's own CUDA context is counted nowhere else.
_CAP_PROBE = """
import sys, torch
from sie_worker.engines.transformers._device import Placement, cap_cuda_memory
fraction = float(sys.argv[1])
cap_cuda_memory(Placement(device="cuda:0", dtype="float32"), fraction)
cap = int(fraction * torch.cuda.get_device_properties(0).total_memory)
half = torch.empty(cap // 2, dtype=torch.uint8, device="cuda:0")
try:
    more = torch.empty(cap, dtype=torch.uint8, device="cuda:0")
except torch.cuda.OutOfMemoryError:
    print(f"{cap // 2} bytes allowed, {cap} more refused under a cap of {cap} bytes")
    sys.exit(0)
print(f"{cap // 2 + cap} bytes allocated under a cap of {cap} bytes")
sys.exit(1)
"""


def smi(query: str) -> list[list[str]]:
    """Rows of ``nvidia-smi --query-<query> --format=csv,noheader,nounits``."""
    out = subprocess.run(
        ["nvidia-smi", f"--query-{query}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return [[cell.strip() for cell in line.split(",")] for line in out.splitlines() if line.strip()]


def gpu_apps() -> dict[int, int | None]:
    """pid -> bytes used of every compute process on the GPUs (None: nvidia-smi says N/A)."""
    rows = smi("compute-apps=pid,used_memory")
    return {int(pid): int(used) * MIB if used.isdigit() else None for pid, used in rows}


def memory_checks(
    url: str,
    device: str,
    placed: Mapping[str, tuple[Path, float | None]],
    *,
    check: Check,
    http: Http,
    engine_of: EngineOf,
    worker_pid: int,
) -> None:
    """Run the checks above on the worker at ``url`` holding the ``placed`` models (id ->
    (its folder, its declared ``memory_gib`` or None))."""

    def models() -> dict[str, Any]:
        return {m["id"]: m for m in http("GET", url + "/v1/models")["data"]}

    def entry() -> dict[str, Any]:
        (found,) = [d for d in http("GET", url + "/v1/devices")["devices"] if d["device"] == device]
        return dict(found)

    def share_device() -> str:
        listed, here = models(), entry()
        for model in placed:
            state = (listed[model]["state"], listed[model]["devices"])
            assert state == ("ready", [device]), f"{model}: {state}"
        assert here["models"] == sorted(placed), f"{device} holds {here['models']}"
        assert here["memory_total_bytes"] is not None, f"{device}: memory unknown: {here}"
        reserved = sum(listed[m]["memory_bytes"] for m in placed)
        assert here["memory_reserved_bytes"] == reserved, (here, reserved)
        assert reserved <= here["memory_budget_bytes"], here
        return (
            f"{device} holds {', '.join(here['models'])}: {reserved / GIB:.2f} GiB reserved "
            f"of {here['memory_budget_bytes'] / GIB:.1f} GiB budget "
            f"({here['memory_total_bytes'] / GIB:.1f} GiB total)"
        )

    def reservations() -> str:
        listed, on_cpu = models(), device.startswith("cpu")
        total = entry()["memory_total_bytes"]
        out = []
        for model, (folder, declared) in placed.items():
            weights = None if declared else weight_bytes(folder)
            want = memory_need(
                "transformers", total, on_cpu=on_cpu, memory_gib=declared, weights_bytes=weights
            )
            got = listed[model]["memory_bytes"]
            assert got == want, f"{model}: memory_bytes {got}, the rule gives {want}"
            why = (
                f"memory_gib {declared}"
                if declared
                else f"weights {weights or 0:,} B x 1.2 + 1 GiB"
            )
            out.append(f"{model} {got / GIB:.3f} GiB ({why})")
        return "; ".join(out)

    check("both models share the device", share_device)
    check("reservations follow the memory rule", reservations)
    if not device.startswith("cuda"):
        return
    listed, total = models(), entry()["memory_total_bytes"]
    engines = {model: engine_of(model)[0] for model in placed}

    def gpu_total() -> str:
        smi_mib = int(smi("gpu=memory.total")[0][0])
        assert abs(total / MIB - smi_mib) <= 1, (
            f"worker {total / MIB:.0f} MiB, nvidia-smi {smi_mib}"
        )
        return f"{total:,} B = nvidia-smi's {smi_mib} MiB"

    def shares() -> str:
        out = []
        for model, pid in engines.items():
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
            told = float(argv[argv.index("--cuda-memory-fraction") + 1])
            want = cuda_cap(listed[model]["memory_bytes"], total)
            assert math.isclose(told, want), f"{model}: --cuda-memory-fraction {told}, want {want}"
            out.append(f"{model} {told}")
        return "--cuda-memory-fraction " + ", ".join(out)

    def within_shares() -> str:
        apps = gpu_apps()
        if all(pid in apps for pid in engines.values()):
            used = {model: apps[pid] for model, pid in engines.items()}
            how = "by pid"
        elif len(apps) == len(engines):  # a container's pid namespace: pair by size
            by_need = sorted(engines, key=lambda m: listed[m]["memory_bytes"])
            sizes: Sequence[int | None] = sorted(apps.values(), key=lambda b: b or 0)
            used = dict(zip(by_need, sizes, strict=True))
            how = f"by size: nvidia-smi's pids {sorted(apps)} are not this namespace's"
        else:
            raise AssertionError(f"nvidia-smi lists {apps}; the engines are {engines}")
        lines = [
            f"{m} {'N/A' if b is None else f'{b / MIB:.0f}'} MiB used of "
            f"{listed[m]['memory_bytes'] / MIB:.0f} MiB reserved"
            for m, b in used.items()
        ]
        over = [m for m, b in used.items() if b is None or b > listed[m]["memory_bytes"]]
        assert not over, f"over or unknown: {over}; " + "; ".join(lines)
        return "; ".join(lines) + f" (matched {how})"

    def worker_without_context() -> str:
        apps = gpu_apps()
        if all(pid in apps for pid in engines.values()):
            assert worker_pid not in apps, f"the worker (pid {worker_pid}) is a compute app"
            return f"worker pid {worker_pid} not among nvidia-smi's compute apps {sorted(apps)}"
        assert len(apps) == len(engines), f"{len(engines)} engines, compute apps {apps}"
        return f"nvidia-smi lists {len(apps)} compute apps, the {len(engines)} engines"

    def cap_holds() -> str:
        largest = max(placed, key=lambda m: listed[m]["memory_bytes"])
        fraction = cuda_cap(listed[largest]["memory_bytes"], total)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
        }
        probe = subprocess.run(
            [sys.executable, "-c", _CAP_PROBE, str(fraction)],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        detail = (probe.stdout.strip() or probe.stderr.strip()[-400:]) + f" (fraction {fraction})"
        assert probe.returncode == 0, detail
        return detail

    check("device total is the GPU's", gpu_total)
    check("engines were given their shares", shares)
    check("nvidia-smi: each engine within its reservation", within_shares)
    check("the worker holds no CUDA context", worker_without_context)
    check("the CUDA allocator cap refuses to grow past it", cap_holds)
