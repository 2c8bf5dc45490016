"""Shared plumbing of the benchmarks: processes, pinning, percentiles, result files.

Every ``bench_*.py`` writes its figures to ``tests/bench/out/<name>.json`` (ignored by git);
``tests/bench/report.py`` turns them into ``docs/benchmarks.md``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from tests.support import loopback
from tests.support.engine_fixtures import FAKE_ENGINE_SCRIPT
from tests.support.ports import free_port
from tests.support.worker_fixtures import fake_model, write_config

__all__ = [
    "MODEL",
    "OUT",
    "ROOT",
    "Service",
    "cpu_seconds",
    "fake_engine_command",
    "machine",
    "percentile",
    "pin",
    "pinning_available",
    "prepare",
    "services",
    "spawn",
    "start_worker",
    "summary",
    "taskset",
    "wait_http",
    "worker_env",
    "write_result",
]

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "bench" / "out"
MODEL = "bench/fake"


def prepare() -> None:
    """Run every benchmark process with cached bytecode, as the image does.

    This shell sets PYTHONDONTWRITEBYTECODE and the venv holds no ``.pyc``, so each process
    would compile every module it imports on every start (about a second for the worker).
    The cache goes under ``tests/bench/out/pycache``; the venv is left alone.
    """
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ.setdefault("PYTHONPYCACHEPREFIX", str(OUT / "pycache"))


def fake_engine_command() -> str:
    """``SIE_SGLANG_COMMAND`` for the fake engine with its fast-starting parser."""
    return shlex.join([sys.executable, str(FAKE_ENGINE_SCRIPT), "--fake-parser=minimal"])


def pinning_available() -> bool:
    """Two CPUs we may pin to (the proxy tier on one, engine and client on the other)."""
    try:
        return len(os.sched_getaffinity(0)) >= 2
    except (AttributeError, OSError):
        return False


def pin(pid: int, cpus: set[int]) -> None:
    """Pin every thread of ``pid`` (sched_setaffinity applies per thread)."""
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(ProcessLookupError, OSError):
                os.sched_setaffinity(int(tid), cpus)


def taskset(cpus: set[int] | None) -> list[str]:
    return ["taskset", "-c", ",".join(map(str, sorted(cpus)))] if cpus else []


def cpu_seconds(pids: Sequence[int]) -> float:
    """CPU time of ``pids`` so far, all threads: nanosecond ``schedstat`` where Linux has it
    (psutil's user + system time moves in 10 ms ticks, too coarse for a 4 s window)."""
    total = 0.0
    for pid in pids:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
            total += sum(_schedstat_ns(pid, int(tid)) for tid in tasks) / 1e9
        except (FileNotFoundError, ProcessLookupError, ValueError):
            with contextlib.suppress(psutil.NoSuchProcess):
                times = psutil.Process(pid).cpu_times()
                total += times.user + times.system
    return total


def _schedstat_ns(pid: int, tid: int) -> int:
    try:
        with open(f"/proc/{pid}/task/{tid}/schedstat") as stat:
            return int(stat.read().split()[0])
    except (FileNotFoundError, ProcessLookupError):
        return 0  # the thread ended between listing and reading


def wait_http(
    url: str, timeout_s: float = 30.0, *, proc: subprocess.Popen[bytes] | None = None
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode} before {url} answered")
        with contextlib.suppress(httpx.HTTPError):
            if loopback.get(url, timeout=1.0).status_code == 200:
                return
        time.sleep(0.02)
    raise TimeoutError(f"{url} did not answer 200 within {timeout_s}s")


@dataclass
class Service:
    """A server process the benchmark started (stopped with SIGTERM, then SIGKILL)."""

    name: str
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def pids(self, *, children: bool = False) -> list[int]:
        pids = [self.proc.pid]
        if children:
            with contextlib.suppress(psutil.NoSuchProcess):
                pids += [c.pid for c in psutil.Process(self.proc.pid).children(recursive=True)]
        return pids

    def stop(self, grace_s: float = 15.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def spawn(
    name: str,
    argv: Sequence[str],
    *,
    port: int,
    env: Mapping[str, str],
    cpus: set[int] | None = None,
) -> Service:
    OUT.mkdir(parents=True, exist_ok=True)
    log = OUT / f"{name}.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [*taskset(cpus), *argv], env=dict(env), stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT
        )
    return Service(name, proc, port, log)


def worker_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SIE_", "CUDA_VISIBLE"))}
    env.update(
        {
            "SIE_SGLANG_COMMAND": fake_engine_command(),
            "SIE_DEVICES": "cuda:0",
            "SIE_BUNDLE": "sglang",
            "SIE_ENGINE_STOP_GRACE_S": "5",
            "SIE_DRAIN_TIMEOUT_S": "5",
            "FAKE_ENGINE_MAX_LIFETIME_S": "1800",  # a safety net against orphans
            "HF_HUB_OFFLINE": "1",
            "SIE_WEIGHTS_DOWNLOAD": "engine",  # the fake engine needs no weights
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(extra or {})
    return env


def start_worker(
    name: str,
    config_dir: Path,
    *,
    cpus: set[int] | None = None,
    env: Mapping[str, str] | None = None,
    argv_prefix: Sequence[str] = (),
    models: Sequence[Mapping[str, Any]] = (),
) -> Service:
    """``sie-worker serve`` on a free port with the fake engine; waits for ``/healthz``."""
    config_dir.mkdir(parents=True, exist_ok=True)
    for config in models or [fake_model(MODEL)]:
        write_config(config_dir, config)
    port = free_port()
    argv = [
        *(argv_prefix or [sys.executable, "-m", "sie_worker"]),
        "serve",
        "--config-dir",
        str(config_dir),
        "--port",
        str(port),
    ]
    service = spawn(name, argv, port=port, env=worker_env(env), cpus=cpus)
    try:
        wait_http(service.url + "/healthz", proc=service.proc)
    except BaseException:
        service.stop()
        raise
    return service


@contextlib.contextmanager
def services() -> Iterator[list[Service]]:
    """Collects services; stops them all (last started first) however the block ends."""
    started: list[Service] = []
    try:
        yield started
    finally:
        for service in reversed(started):
            service.stop()


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile of unsorted ``values``."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def summary(values: Sequence[float]) -> dict[str, float | int | None]:
    return {
        "n": len(values),
        "p50": percentile(values, 0.50),
        "p90": percentile(values, 0.90),
        "p99": percentile(values, 0.99),
        "min": min(values) if values else None,
        "max": max(values) if values else None,
    }


def machine() -> dict[str, Any]:
    model = platform.processor()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "nproc": os.cpu_count(),
        "cpus_allowed": len(os.sched_getaffinity(0)),
        "cpu_model": model,
        "python": platform.python_version(),
        "kernel": platform.release(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "loadavg_1m": os.getloadavg()[0],
    }


def write_result(name: str, data: Mapping[str, Any]) -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), **data}, indent=2) + "\n")
    return path
