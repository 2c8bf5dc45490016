"""The default engine (``python -m sie_worker.engines.transformers``) as a real subprocess
on a free 127.0.0.1 port, on CPU, offline: ``start_engine(args, log)`` waits for ``/health``
(or not, with ``wait=False``); ``stop_engine`` stops it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.support import loopback
from tests.support.ports import start_on_free_port

__all__ = ["ENGINE", "Engine", "start_engine", "stop_engine"]

ENGINE = [sys.executable, "-m", "sie_worker.engines.transformers"]


@dataclass
class Engine:
    process: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        return loopback.post(self.url + path, json=body, timeout=120.0)

    def stream(self, path: str, body: dict[str, Any]) -> list[str]:
        """The ``data:`` payloads of a server-sent-event response, in order."""
        with loopback.stream("POST", self.url + path, json=body, timeout=120.0) as response:
            assert response.status_code == 200, response.read()
            assert response.headers["content-type"].startswith("text/event-stream")
            return [line[6:] for line in response.iter_lines() if line.startswith("data: ")]


def start_engine(args: list[str], log: Path, *, wait: bool = True) -> Engine:
    """Start the engine on a free port. The port is free when picked but another process
    may bind it before the engine does (a busy machine runs many tests): then, and only
    then, the engine is started again on another port."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1"}

    def launch(port: int) -> tuple[Engine, subprocess.Popen[bytes], Path]:
        with log.open("wb") as out:
            process = subprocess.Popen(
                [*ENGINE, *args, "--host", "127.0.0.1", "--port", str(port)],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        return Engine(process, port, log), process, log

    return start_on_free_port(launch, _wait_ready if wait else None)


def _wait_ready(engine: Engine, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if engine.process.poll() is not None:
            raise AssertionError(
                f"engine exited {engine.process.returncode}:\n{engine.log.read_text()}"
            )
        try:
            if loopback.get(engine.url + "/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"engine not ready within {timeout}s:\n{engine.log.read_text()}")


def stop_engine(engine: Engine) -> None:
    if engine.process.poll() is None:
        engine.process.send_signal(signal.SIGTERM)
        try:
            engine.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            engine.process.kill()
            engine.process.wait()
