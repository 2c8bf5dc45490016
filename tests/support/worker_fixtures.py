"""A real ``sie-worker serve`` subprocess for API and end-to-end tests.

``start_worker(configs, devices=..., env=...)`` writes the configs into a temp config dir,
starts the worker on a free 127.0.0.1 port with the fake SGLang engine as
``SIE_SGLANG_COMMAND``, waits for ``/healthz`` and returns a :class:`WorkerProcess`. Every
worker is stopped at the end of the test, and the test fails if an engine outlived it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import yaml

from tests.support import loopback
from tests.support.ports import listens, start_on_free_port

__all__ = [
    "WorkerProcess",
    "fake_model",
    "module_start_worker",
    "start_worker",
    "wait_healthy",
    "wait_until",
    "worker_starter",
    "write_config",
]

GENERATION = "sie_server.adapters.sglang.generation:SGLangGenerationAdapter"
EMBEDDING = "sie_server.adapters.sglang.embedding:SGLangEmbeddingAdapter"


def wait_until(
    predicate: Callable[[], bool], timeout: float = 20.0, interval: float = 0.05
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


def fake_model(
    sie_id: str,
    *,
    width: int = 1,
    task: str = "generate",
    env: Mapping[str, str] | None = None,
    profiles: Mapping[str, Any] | None = None,
    **loadtime: Any,
) -> dict[str, Any]:
    """A model config served by the fake SGLang engine (seed 000's format)."""
    options: dict[str, Any] = {"tensor_parallel_size": width, **loadtime}
    if task == "generate" and width > 1:
        options.setdefault("startup_timeout_s", 30)
        options.setdefault("request_read_timeout_s", 30)
    options.setdefault("startup_timeout_s", 30)
    default: dict[str, Any] = {
        "max_batch_tokens": 4096,
        "compute_precision": "bfloat16",
        "kv_budget_tokens": 8192,
        "adapter_path": GENERATION if task == "generate" else EMBEDDING,
        "adapter_options": {"loadtime": options},
    }
    if env:
        default["extra_env"] = dict(env)
    tasks: dict[str, Any] = (
        {"generate": {"context_length": 8192, "max_output_tokens": 512}}
        if task == "generate"
        else {"encode": {}}
    )
    return {
        "sie_id": sie_id,
        "hf_id": sie_id,
        "tasks": tasks,
        "profiles": {"default": default, **dict(profiles or {})},
    }


def write_config(directory: Path, config: Mapping[str, Any]) -> Path:
    path = directory / (str(config["sie_id"]).replace("/", "--") + ".yaml")
    path.write_text(yaml.safe_dump(dict(config), sort_keys=False))
    return path


@dataclass
class WorkerProcess:
    process: subprocess.Popen[bytes]
    port: int
    config_dir: Path
    log_path: Path
    api_key: str | None = None
    # Processes, not bare pids: psutil checks a process's start time before it reports on
    # or signals it, so a pid reused by another program is never mistaken for an engine.
    engines_seen: dict[int, psutil.Process] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, **kwargs: Any) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        kwargs.setdefault("timeout", 60.0)
        return loopback.client(base_url=self.url, headers=headers, **kwargs)

    def get(self, path: str) -> Any:
        with self.client() as client:
            response = client.get(path)
            response.raise_for_status()
            return response.json()

    def models(self) -> dict[str, dict[str, Any]]:
        return {m["id"]: m for m in self.get("/v1/models")["data"]}

    def devices(self) -> dict[str, str | None]:
        return {d["device"]: d["model"] for d in self.get("/v1/devices")["devices"]}

    def engine_pids(self) -> list[int]:
        """Engine processes (the worker's children and their descendants) now."""
        try:
            children = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        for child in children:
            self.engines_seen.setdefault(child.pid, child)
        return [c.pid for c in children]

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        self.engine_pids()
        if self.process.poll() is None:
            self.process.send_signal(signum)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"worker did not exit within {timeout}s after {signum}") from None

    def surviving_engines(self, timeout: float = 10.0) -> list[psutil.Process]:
        """Engines still alive after the worker exited (waits up to ``timeout`` for them)."""
        deadline = time.monotonic() + timeout
        alive = list(self.engines_seen.values())
        while alive and time.monotonic() < deadline:
            alive = [p for p in alive if _alive(p)]
            if alive:
                time.sleep(0.05)
        return alive


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def start_worker(
    tmp_path: Path, fake_engine_minimal_command: str
) -> Iterator[Callable[..., WorkerProcess]]:
    """Start workers whose SGLang engines are the fake engine (with its fast argv parser;
    pass ``env={"SIE_SGLANG_COMMAND": ...}`` for another command)."""
    with worker_starter(tmp_path, fake_engine_minimal_command) as start:
        yield start


@pytest.fixture(scope="module")
def module_start_worker(
    tmp_path_factory: pytest.TempPathFactory, fake_engine_minimal_command: str
) -> Iterator[Callable[..., WorkerProcess]]:
    """:func:`start_worker` for workers a module's tests share (module fixtures)."""
    with worker_starter(tmp_path_factory.mktemp("workers"), fake_engine_minimal_command) as start:
        yield start


@contextlib.contextmanager
def worker_starter(
    tmp_path: Path, fake_engine_minimal_command: str
) -> Iterator[Callable[..., WorkerProcess]]:
    """The workers' starter of :func:`start_worker`, files under ``tmp_path``; each worker
    it started is stopped on leaving, and leaving fails if an engine outlived its worker."""
    workers: list[WorkerProcess] = []

    def start(
        configs: list[Mapping[str, Any]] | None = None,
        *,
        devices: str | None = "cuda:0,cuda:1",
        env: Mapping[str, str] | None = None,
        api_key: str | None = None,
        config_dir: Path | None = None,
        wait: bool = True,
        port: int | None = None,
    ) -> WorkerProcess:
        directory = config_dir or tmp_path / f"configs-{len(workers)}"
        directory.mkdir(parents=True, exist_ok=True)
        for config in configs or []:
            write_config(directory, config)
        log_path = tmp_path / f"worker-{len(workers)}.log"
        full_env = {
            k: v for k, v in os.environ.items() if not k.startswith(("SIE_", "CUDA_VISIBLE"))
        }
        full_env.update(
            {
                "SIE_SGLANG_COMMAND": fake_engine_minimal_command,
                "FAKE_ENGINE_MAX_LIFETIME_S": "900",  # a safety net against orphans
                "SIE_BUNDLE": "sglang",
                "SIE_ENGINE_STOP_GRACE_S": "5",
                "SIE_DRAIN_TIMEOUT_S": "10",
                "HF_HUB_OFFLINE": "1",
                # The fake engine needs no weights: the worker does not fetch hub ids (the
                # tests of the download pass SIE_WEIGHTS_DOWNLOAD=worker and a fake hub).
                "SIE_WEIGHTS_DOWNLOAD": "engine",
                "PYTHONUNBUFFERED": "1",
            }
        )
        if devices is not None:
            full_env["SIE_DEVICES"] = devices
        if api_key:
            full_env["SIE_API_KEY"] = api_key
        full_env.update(env or {})
        argv = [sys.executable, "-m", "sie_worker", "serve", "--config-dir", str(directory)]

        def launch(port: int) -> tuple[WorkerProcess, subprocess.Popen[bytes], Path]:
            with log_path.open("wb") as log:
                process = subprocess.Popen(
                    [*argv, "--port", str(port)], env=full_env, stdout=log, stderr=subprocess.STDOUT
                )
            worker = WorkerProcess(process, port, directory, log_path, api_key)
            workers.append(worker)
            return worker, process, log_path

        # A chosen port (a group's ranks name each other's) is never retried on another.
        return start_on_free_port(launch, wait_healthy if wait else None, port)

    yield start
    leftovers = []
    for worker in workers:
        if worker.process.poll() is None:
            with contextlib.suppress(AssertionError):
                worker.stop()
        leftovers += worker.surviving_engines()
    for process in leftovers:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    assert not leftovers, f"engine processes outlived their worker: {[p.pid for p in leftovers]}"


def wait_healthy(worker: WorkerProcess, timeout: float = 120.0) -> None:
    """Wait until the worker answers /healthz; fail with its log if it exits or times out.

    The bound is generous: a start that fails ends the wait at once (the process exits), and
    with the suite in parallel on a shared machine a sound start has taken over 30 s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if worker.process.poll() is not None:
            raise AssertionError(
                f"worker exited with {worker.process.returncode}:\n{worker.logs()}"
            )
        with contextlib.suppress(httpx.HTTPError):
            if loopback.get(worker.url + "/healthz", timeout=1.0).status_code == 200 and listens(
                worker.process.pid, worker.port
            ):
                return
        time.sleep(0.05)
    raise AssertionError(f"worker not healthy within {timeout}s:\n{worker.logs()}")
