"""The real llama.cpp of the tests: ``llama-server`` and ``ggml-rpc-server`` built into
``.tools/bin`` by scripts/setup-llamacpp (from the pinned sdist of tools/llamacpp.txt), and
starters that run them on 127.0.0.1 for a test.

Tests that use them are marked ``llamacpp``. A missing binary fails them, saying how to build
it: a real engine that cannot start is never skipped.

Each process runs with a scrubbed environment: no ``LLAMA_ARG_*`` or ``LLAMA_API_KEY`` (every
llama-server flag also reads one), ``HOME`` and ``XDG_CONFIG_HOME`` in the test's folder (so
no ``~/.config/llama.cpp/config.ini`` applies), and ``GGML_NO_BACKTRACE=1`` (an abort then
exits at once instead of running gdb for a backtrace).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support import loopback
from tests.support.ports import start_on_free_port
from tests.support.repo import ROOT

__all__ = [
    "LLAMA_SERVER",
    "RPC_SERVER",
    "LlamaServer",
    "RpcServer",
    "llamacpp_binary",
    "llamacpp_env",
    "start_llama_server",
    "start_rpc_server",
    "stop",
]

LLAMA_SERVER = ROOT / ".tools" / "bin" / "llama-server"
RPC_SERVER = ROOT / ".tools" / "bin" / "ggml-rpc-server"
# What a tiny model needs on the 2-core machines here: one thread, a small context.
SMALL = ("-t", "1", "-c", "256")


def llamacpp_binary(path: Path) -> Path:
    """``path`` (one of the two binaries), failing the test when it is not built."""
    if not os.access(path, os.X_OK):
        pytest.fail(
            f"{path} is missing: the llama.cpp tests need llama-server and ggml-rpc-server; "
            "run scripts/setup-llamacpp (make test does)"
        )
    return path


def llamacpp_env(home: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a llama.cpp process: this one's, less what would change its flags."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("LLAMA_ARG_") and k != "LLAMA_API_KEY"
    }
    home.mkdir(parents=True, exist_ok=True)
    env |= {"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config")}
    env["GGML_NO_BACKTRACE"] = "1"
    return env | dict(extra or {})


@dataclass
class LlamaServer:
    process: subprocess.Popen[bytes]
    port: int
    log: Path
    argv: tuple[str, ...]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class RpcServer:
    process: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


def start_llama_server(
    model: Path,
    workdir: Path,
    *,
    args: Sequence[str] = (),
    wait: bool = True,
    timeout: float = 60.0,
) -> LlamaServer:
    """llama-server serving ``model`` on 127.0.0.1 (a free port) with ``--metrics``, one thread
    and a 256-token context, then ``args``; waits for ``/health`` 200 unless ``wait`` is
    False. Its output goes to ``workdir/llama-server-<port>.log``."""
    binary = llamacpp_binary(LLAMA_SERVER)

    def launch(port: int) -> tuple[LlamaServer, subprocess.Popen[bytes], Path]:
        argv = (
            str(binary),
            "-m",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--metrics",
            *SMALL,
            *args,
        )
        log = workdir / f"llama-server-{port}.log"
        process = _spawn(argv, log, workdir)
        return LlamaServer(process, port, log, argv), process, log

    def ready(server: LlamaServer) -> None:
        _wait_for(lambda: _health(server.url) == 200, server.process, server.log, timeout)

    return start_on_free_port(launch, ready if wait else None)


def start_rpc_server(workdir: Path, *, timeout: float = 30.0) -> RpcServer:
    """ggml-rpc-server on 127.0.0.1 (a free port), its CPU device, one thread; waits until
    its port accepts a connection."""
    binary = llamacpp_binary(RPC_SERVER)

    def launch(port: int) -> tuple[RpcServer, subprocess.Popen[bytes], Path]:
        log = workdir / f"ggml-rpc-server-{port}.log"
        argv = (str(binary), "-H", "127.0.0.1", "-p", str(port), "-t", "1")
        process = _spawn(argv, log, workdir)
        return RpcServer(process, port, log), process, log

    def ready(server: RpcServer) -> None:
        _wait_for(lambda: _accepts(server.port), server.process, server.log, timeout)

    return start_on_free_port(launch, ready)


def stop(process: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 20) -> int:
    """Send ``sig`` (unless the process has exited) and return its exit status."""
    if process.poll() is None:
        process.send_signal(sig)
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)
        raise


def _spawn(argv: Sequence[str], log: Path, workdir: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=llamacpp_env(workdir / "home"),
            cwd=workdir,
        )


def _health(url: str) -> int | None:
    try:
        return loopback.get(f"{url}/health", timeout=2).status_code
    except httpx.TransportError:
        return None


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _wait_for(
    predicate: Callable[[], bool], process: subprocess.Popen[bytes], log: Path, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if process.poll() is not None:
            raise AssertionError(
                f"exited with {process.returncode} before it was ready:\n"
                + log.read_text(errors="replace")[-4000:]
            )
        if time.monotonic() > deadline:
            raise AssertionError(f"not ready within {timeout}s:\n" + log.read_text()[-4000:])
        time.sleep(0.05)
