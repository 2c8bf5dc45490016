"""Pods and gateways as real processes over 127.0.0.1, for gateway and cluster tests.

``start_pod(configs, devices=..., slots=...)`` starts ``slots`` ``sie-worker serve``
processes (fake SGLang engines, through ``start_worker``) and one ``sie-worker route`` in
front of them, and returns a :class:`PodProcess` once the router reports every slot up.
``start_gateway(pools, ...)`` writes a pools file and starts ``sie-worker gateway``.
Everything started is stopped at the end of the test (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support import loopback
from tests.support.ports import listens, start_on_free_port
from tests.support.worker_fixtures import WorkerProcess, wait_until

__all__ = [
    "GatewayProcess",
    "PodProcess",
    "gateway_starter",
    "module_start_gateway",
    "module_start_pod",
    "pod_starter",
    "start_gateway",
    "start_pod",
    "stop_process",
    "write_pools",
]


def stop_process(process: subprocess.Popen[bytes], timeout: float = 30.0) -> int:
    """SIGTERM (and SIGCONT, in case it is stopped), then SIGKILL past ``timeout``."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGCONT)
            process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()


@dataclass
class PodProcess:
    """One pod on this machine: a router process in front of its worker processes."""

    router: subprocess.Popen[bytes]
    port: int
    workers: list[WorkerProcess]
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")

    def ready(self) -> bool:
        assert self.router.poll() is None, self.logs()
        try:
            body = loopback.get(self.url + "/readyz", timeout=2).json()
        except (httpx.HTTPError, ValueError):
            return False
        if not isinstance(body, dict) or "slots" not in body:
            return False  # not a router's answer (yet)
        ready = all(s["up"] and s["ready"] for s in body["slots"])
        return ready and listens(self.router.pid, self.port)


@dataclass
class GatewayProcess:
    process: subprocess.Popen[bytes]
    port: int
    pools_file: Path
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")

    def client(self, **kwargs: Any) -> httpx.Client:
        return loopback.client(base_url=self.url, timeout=60.0, trust_env=False, **kwargs)

    def write_pools(self, pools: Sequence[Mapping[str, Any]]) -> None:
        """Rewrite the pools file (the gateway re-reads local endpoints when it changes)."""
        write_pools(self.pools_file, pools)

    def metric(self, name: str) -> float:
        text = loopback.get(self.url + "/metrics", timeout=5).text
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        return 0.0


def write_pools(path: Path, pools: Sequence[Mapping[str, Any]]) -> None:
    """Write a pools file atomically (a reader never sees half of it)."""
    temporary = path.with_suffix(".tmp")
    temporary.write_text(yaml.safe_dump([dict(p) for p in pools], sort_keys=False))
    temporary.replace(path)


def _base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIE_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture
def start_pod(
    start_worker: Callable[..., WorkerProcess], tmp_path: Path
) -> Iterator[Callable[..., PodProcess]]:
    with pod_starter(start_worker, tmp_path) as start:
        yield start


@pytest.fixture(scope="module")
def module_start_pod(
    module_start_worker: Callable[..., WorkerProcess], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., PodProcess]]:
    """:func:`start_pod` for pods a module's tests share (module fixtures)."""
    with pod_starter(module_start_worker, tmp_path_factory.mktemp("pods")) as start:
        yield start


@contextlib.contextmanager
def pod_starter(
    start_worker: Callable[..., WorkerProcess], tmp_path: Path
) -> Iterator[Callable[..., PodProcess]]:
    """The pods' starter of :func:`start_pod`: routers in front of ``start_worker``'s
    workers, logs under ``tmp_path``, each router stopped on leaving."""
    pods: list[PodProcess] = []

    def start(
        configs: list[Mapping[str, Any]],
        *,
        slots: int = 1,
        devices: str = "cuda:0",
        worker_env: Mapping[str, str] | None = None,
        router_env: Mapping[str, str] | None = None,
        port: int | None = None,
        wait: bool = True,
        workers: Sequence[WorkerProcess] | None = None,
    ) -> PodProcess:
        """``workers``: existing worker processes to route to (``configs``, ``slots``,
        ``devices`` and ``worker_env`` are then unused)."""
        if workers is None:
            # Each worker healthy on a port of its own before the router is given the ports:
            # a worker that lost its port to another process would leave the router polling
            # someone else's worker (start_worker starts it again on a new port).
            workers = [start_worker(configs, devices=devices, env=worker_env) for _ in range(slots)]
        workers, slots = list(workers), len(workers)
        log_path = tmp_path / f"router-{len(pods)}.log"
        env = _base_env()
        env.update(
            {
                "SIE_GPU_COUNT": str(slots),
                "SIE_WORKER_PORTS": ",".join(str(w.port) for w in workers),
                "SIE_ROUTER_POLL_INTERVAL_S": "0.2",
                "SIE_ROUTER_POLL_TIMEOUT_S": "1",
                **(router_env or {}),
            }
        )
        argv = [sys.executable, "-m", "sie_worker", "route", "--host", "127.0.0.1"]

        def launch(chosen: int) -> tuple[PodProcess, subprocess.Popen[bytes], Path]:
            with log_path.open("wb") as log:
                router = subprocess.Popen(
                    [*argv, "--port", str(chosen)], env=env, stdout=log, stderr=subprocess.STDOUT
                )
            pod = PodProcess(router, chosen, workers, log_path)
            pods.append(pod)
            return pod, router, log_path

        def ready(pod: PodProcess) -> None:
            wait_until(pod.ready, timeout=90, interval=0.1)

        return start_on_free_port(launch, ready if wait else None, port)

    yield start
    for pod in pods:
        stop_process(pod.router)


def _wait_gateway(gateway: GatewayProcess, timeout: float = 60.0) -> None:
    """Until the gateway answers /readyz on its own port (not another process that took it)."""
    deadline = time.monotonic() + timeout
    while True:
        assert gateway.process.poll() is None, gateway.logs()
        with contextlib.suppress(httpx.HTTPError):
            if loopback.get(gateway.url + "/readyz", timeout=1).status_code == 200 and listens(
                gateway.process.pid, gateway.port
            ):
                return
        assert time.monotonic() < deadline, f"gateway not ready:\n{gateway.logs()}"
        time.sleep(0.05)


@pytest.fixture
def start_gateway(tmp_path: Path) -> Iterator[Callable[..., GatewayProcess]]:
    with gateway_starter(tmp_path) as start:
        yield start


@pytest.fixture(scope="module")
def module_start_gateway(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., GatewayProcess]]:
    """:func:`start_gateway` for gateways a module's tests share (module fixtures)."""
    with gateway_starter(tmp_path_factory.mktemp("gateways")) as start:
        yield start


@contextlib.contextmanager
def gateway_starter(tmp_path: Path) -> Iterator[Callable[..., GatewayProcess]]:
    """The gateways' starter of :func:`start_gateway`, files under ``tmp_path``, each
    gateway stopped on leaving."""
    gateways: list[GatewayProcess] = []

    def start(
        pools: Sequence[Mapping[str, Any]],
        *,
        env: Mapping[str, str] | None = None,
        config_dir: Path | None = None,
        port: int | None = None,
        wrapper: Sequence[str] = (),
        wait: bool = True,
    ) -> GatewayProcess:
        index = len(gateways)
        pools_file = tmp_path / f"gateway-{index}-pools.yaml"
        log_path = tmp_path / f"gateway-{index}.log"
        full_env = _base_env()
        full_env.update(
            {
                "SIE_GATEWAY_POOLS": str(pools_file),
                "SIE_GATEWAY_POLL_INTERVAL_S": "0.2",
                "SIE_GATEWAY_POLL_TIMEOUT_S": "1",
                "SIE_GATEWAY_RELOAD_INTERVAL_S": "0.2",
                **(env or {}),
            }
        )
        write_pools(pools_file, pools)

        def launch(chosen: int) -> tuple[GatewayProcess, subprocess.Popen[bytes], Path]:
            argv = [*wrapper, sys.executable, "-m", "sie_worker", "gateway", "--port", str(chosen)]
            if config_dir is not None:
                argv += ["--config-dir", str(config_dir)]
            with log_path.open("wb") as log:
                process = subprocess.Popen(argv, env=full_env, stdout=log, stderr=subprocess.STDOUT)
            gateway = GatewayProcess(process, chosen, pools_file, log_path, full_env)
            gateways.append(gateway)
            return gateway, process, log_path

        return start_on_free_port(launch, _wait_gateway if wait else None, port)

    yield start
    for gateway in gateways:
        stop_process(gateway.process)
