"""Pytest fixtures for the fake SGLang engine (``tests/support/fake_engine.py``).

- ``fake_engine_command``: the ``SIE_SGLANG_COMMAND`` value that runs the fake with SGLang's
  own argument parser (a slow import: seconds per engine start).
- ``fake_engine_minimal_command``: the same with the fake's minimal parser (fast start), for
  load storms and benchmarks.
- ``fake_engine_factory``: start fake engines directly on free ports (for tests of the fake or
  of the proxy in isolation); every process group is stopped at teardown.
- ``fake_engine``: one ready fake engine with default arguments (minimal parser).

``start_fake_engine`` and ``stop_process_group`` are plain functions for module-scoped use.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest

from tests.support import loopback, ports
from tests.support.ports import listens

__all__ = [
    "FAKE_ENGINE_SCRIPT",
    "FakeEngine",
    "FakeEngineFactory",
    "fake_engine",
    "fake_engine_command",
    "fake_engine_factory",
    "fake_engine_minimal_command",
    "start_fake_engine",
    "stop_process_group",
]

FAKE_ENGINE_SCRIPT = Path(__file__).resolve().with_name("fake_engine.py")

Wait = Literal["ready", "listening", "none"]
Parser = Literal["sglang", "minimal", "auto"]

# A fake outlives a crashed test run by at most this long (the fixtures stop it sooner).
_SAFETY_LIFETIME_S = "900"
_DEFAULT_ARGS = ("--model-path", "/models/fake", "--served-model-name", "fake/model")


def stop_process_group(proc: subprocess.Popen[bytes], grace_s: float = 5.0) -> int | None:
    """SIGTERM the process group, SIGKILL it after ``grace_s``; reap the leader."""
    pgid = proc.pid  # started with start_new_session=True: the leader's pid is the group id
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
    # Also reaches rank processes left behind when the leader died on its own.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    return proc.wait(timeout=grace_s)


@dataclass
class FakeEngine:
    """A running fake engine started by ``start_fake_engine``."""

    proc: subprocess.Popen[bytes]
    host: str
    port: int
    argv: list[str]
    stdout_path: Path
    stderr_path: Path
    _stopped: bool = field(default=False, repr=False)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    def info(self) -> dict[str, Any]:
        """``GET /_fake/info``: argv, env, counters (see fake_engine's docstring)."""
        response = loopback.get(f"{self.url}/_fake/info", timeout=10)
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    def wait_listening(self, timeout_s: float = 30.0) -> None:
        self._wait(timeout_s, ready=False)

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        self._wait(timeout_s, ready=True)

    def wait_exit(self, timeout_s: float = 30.0) -> int:
        return self.proc.wait(timeout=timeout_s)

    def stop(self, grace_s: float = 5.0) -> int | None:
        self._stopped = True
        return stop_process_group(self.proc, grace_s)

    def _wait(self, timeout_s: float, *, ready: bool) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            code = self.proc.poll()
            if code is not None:
                raise RuntimeError(
                    f"fake engine exited with {code} before it was "
                    f"{'ready' if ready else 'listening'}; stderr:\n{self.stderr()[-2000:]}"
                )
            try:
                response = loopback.get(f"{self.url}/health", timeout=2)
            except httpx.TransportError:
                pass
            else:
                # Another process may have taken the port while this one was still starting
                # (SGLang's parser takes seconds to import): its answer is not this engine's,
                # which will exit with "address already in use" and be started again.
                mine = listens(self.proc.pid, self.port)
                if mine and (not ready or response.status_code == 200):
                    return
            time.sleep(0.02)
        raise TimeoutError(f"fake engine on port {self.port} not up after {timeout_s} s")


def start_fake_engine(
    log_dir: Path,
    args: Sequence[str] = (),
    *,
    env: Mapping[str, str] | None = None,
    parser: Parser = "minimal",
    port: int | None = None,
    host: str = "127.0.0.1",
    wait: Wait = "ready",
    timeout_s: float = 60.0,
) -> FakeEngine:
    """Start ``fake_engine.py`` in its own process group on ``port`` (free one if None).

    ``args`` are SGLang flags; ``--model-path`` and ``--served-model-name`` default to a fake
    model, ``--host``/``--port`` are added. ``env`` is added to this process's environment.
    With a picked port, "Address already in use" at start is retried on another port.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    flags = list(args) if "--model-path" in args else [*_DEFAULT_ARGS, *args]
    full_env = {"FAKE_ENGINE_MAX_LIFETIME_S": _SAFETY_LIFETIME_S, **os.environ, **(env or {})}
    for attempt in range(5):
        chosen = port if port is not None else ports.free_port(host)
        argv = [*flags, "--host", host, "--port", str(chosen)]
        stem = f"fake-engine-{chosen}-{time.monotonic_ns()}"
        stdout_path, stderr_path = log_dir / f"{stem}.out", log_dir / f"{stem}.err"
        with stdout_path.open("wb") as out, stderr_path.open("wb") as err:
            proc = subprocess.Popen(
                [sys.executable, str(FAKE_ENGINE_SCRIPT), f"--fake-parser={parser}", *argv],
                stdout=out,
                stderr=err,
                env=full_env,
                start_new_session=True,
            )
        engine = FakeEngine(proc, host, chosen, argv, stdout_path, stderr_path)
        if wait == "none":
            return engine
        try:
            if wait == "ready":
                engine.wait_ready(timeout_s)
            else:
                engine.wait_listening(timeout_s)
        except RuntimeError:
            stop_process_group(proc)
            taken = "Address already in use" in engine.stderr() and "(--port)" in engine.stderr()
            if port is None and taken and attempt < 4:
                continue
            raise
        except BaseException:
            stop_process_group(proc)
            raise
        return engine
    raise AssertionError("unreachable")  # pragma: no cover


class FakeEngineFactory:
    """Starts fake engines (``start_fake_engine`` arguments) and stops them all at teardown."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.engines: list[FakeEngine] = []

    def __call__(self, *args: str, **kwargs: Any) -> FakeEngine:
        engine = start_fake_engine(self.log_dir, args, **kwargs)
        self.engines.append(engine)
        return engine

    def stop_all(self) -> None:
        for engine in self.engines:
            with contextlib.suppress(subprocess.TimeoutExpired):
                engine.stop()


@pytest.fixture(scope="session")
def fake_engine_command() -> str:
    """``SIE_SGLANG_COMMAND`` for the fake engine parsing argv with SGLang's own parser."""
    return shlex.join([sys.executable, str(FAKE_ENGINE_SCRIPT)])


@pytest.fixture(scope="session")
def fake_engine_minimal_command() -> str:
    """``SIE_SGLANG_COMMAND`` for the fake engine with its fast-starting minimal parser."""
    return shlex.join([sys.executable, str(FAKE_ENGINE_SCRIPT), "--fake-parser=minimal"])


@pytest.fixture
def fake_engine_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeEngineFactory]:
    """Start fake engines with ``factory(*sglang_args, env=..., parser=..., wait=...)``."""
    factory = FakeEngineFactory(tmp_path_factory.mktemp("fake-engine"))
    try:
        yield factory
    finally:
        factory.stop_all()


@pytest.fixture
def fake_engine(fake_engine_factory: FakeEngineFactory) -> FakeEngine:
    """One ready fake generation engine (minimal parser, default model names)."""
    return fake_engine_factory()
