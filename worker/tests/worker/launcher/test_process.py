"""EngineProcess against real fake-engine subprocesses."""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from tests.support.ports import free_port

from sie_worker.errors import LoadFailed, StartupTimeout
from sie_worker.worker.launcher.group import group_members
from sie_worker.worker.launcher.process import _HEALTH_TIMEOUT_S, EngineProcess


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _argv(command: str, port: int) -> list[str]:
    return [
        *shlex.split(command),
        "--model-path",
        "org/m",
        "--served-model-name",
        "org/m",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_ENGINE")}
    env.update({"FAKE_ENGINE_MAX_LIFETIME_S": "120", **extra})
    return env


@pytest.mark.anyio
async def test_engine_becomes_ready_and_stops_its_whole_process_group(
    fake_engine_minimal_command: str,
) -> None:
    port = free_port()
    engine = await EngineProcess.start(
        "org/m", _argv(fake_engine_minimal_command, port), _env(FAKE_ENGINE_CHILDREN="2"), port
    )
    async with httpx.AsyncClient() as client:
        await engine.wait_ready(client, "/health", timeout_s=30)
        info = (await client.get(f"{engine.base_url}/_fake/info")).json()
    ranks = info["children"]
    assert len(ranks) == 2
    assert os.getpgid(engine.pid) == engine.pid  # its own process group
    code = await engine.stop(grace_s=5)
    assert code == 0
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in ranks)
    assert any("server_args" in line or "fake engine" in line for line in engine.tail)


@pytest.mark.anyio
async def test_engine_exiting_at_start_fails_the_load_with_code_and_output(
    fake_engine_minimal_command: str,
) -> None:
    port = free_port()
    engine = await EngineProcess.start(
        "org/m", _argv(fake_engine_minimal_command, port), _env(FAKE_ENGINE_EXIT_AT_START="7"), port
    )
    async with httpx.AsyncClient() as client:
        with pytest.raises(LoadFailed, match="exited during startup with code 7") as caught:
            await engine.wait_ready(client, "/health", timeout_s=30)
    assert "last engine output" in caught.value.message
    await engine.stop(grace_s=1)


@pytest.mark.anyio
async def test_engine_never_ready_times_out(fake_engine_minimal_command: str) -> None:
    port = free_port()
    engine = await EngineProcess.start(
        "org/m", _argv(fake_engine_minimal_command, port), _env(FAKE_ENGINE_NEVER_READY="1"), port
    )
    async with httpx.AsyncClient() as client:
        with pytest.raises(StartupTimeout, match=r"startup_timeout_s=0\.5s"):
            await engine.wait_ready(client, "/health", timeout_s=0.5)
    await engine.stop(grace_s=5)
    assert engine.returncode is not None


@pytest.mark.anyio
async def test_an_engine_exiting_while_its_health_check_hangs_fails_at_once() -> None:
    # Another process holds the port: it accepts the check and never answers it.
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        argv = [sys.executable, "-c", "import time; time.sleep(1); raise SystemExit(7)"]
        engine = await EngineProcess.start("org/m", argv, _env(), port)
        started = time.monotonic()
        async with httpx.AsyncClient() as client:
            with pytest.raises(LoadFailed, match="exited during startup with code 7"):
                await engine.wait_ready(client, "/health", timeout_s=60)
    # Seen when the process ended, not when the check gave up.
    assert time.monotonic() - started < _HEALTH_TIMEOUT_S


@pytest.mark.anyio
async def test_engine_ignoring_sigterm_is_killed_after_the_grace_period(
    fake_engine_minimal_command: str,
) -> None:
    port = free_port()
    engine = await EngineProcess.start(
        "org/m",
        _argv(fake_engine_minimal_command, port),
        _env(FAKE_ENGINE_IGNORE_SIGTERM="1"),
        port,
    )
    async with httpx.AsyncClient() as client:
        await engine.wait_ready(client, "/health", timeout_s=30)
    started = time.monotonic()
    code = await engine.stop(grace_s=0.5)
    assert code == -9
    assert time.monotonic() - started < 10


@pytest.mark.anyio
async def test_a_missing_engine_binary_is_a_load_failure() -> None:
    with pytest.raises(LoadFailed, match="cannot start engine"):
        await EngineProcess.start("org/m", ["/nonexistent/engine"], {}, 1)


class _Listed:
    """A psutil.Process stand-in whose sockets cannot be listed for ``reason``."""

    def __init__(self, pid: int, reason: psutil.Error) -> None:
        self.pid = pid
        self._reason = reason

    def children(self, recursive: bool = False) -> list[_Listed]:
        return []

    def net_connections(self, kind: str = "inet") -> list[object]:
        raise self._reason


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("reason", "owns"),
    [
        # Exited but not yet reaped: it listens on nothing, so a 200 came from another process.
        (psutil.ZombieProcess(1), False),
        (psutil.NoSuchProcess(1), False),
        # Not allowed to look: unknowable, so the engine's answer is believed.
        (psutil.AccessDenied(1), True),
    ],
)
async def test_an_engine_that_exited_unreaped_does_not_own_its_port_but_a_hidden_one_might(
    monkeypatch: pytest.MonkeyPatch, reason: psutil.Error, owns: bool
) -> None:
    argv = [sys.executable, "-c", "import time; time.sleep(30)"]
    engine = await EngineProcess.start("org/m", argv, _env(), free_port())
    try:
        monkeypatch.setattr(psutil, "Process", lambda pid: _Listed(pid, reason))
        assert engine._owns_port() is owns
    finally:
        monkeypatch.undo()
        await engine.stop(5)


# --- the engine as a process group: ranks, shared memory, scratch ------------------------


def _exist(paths: list[str]) -> list[str]:
    return [p for p in paths if os.path.exists(p)]


def _fake_shm(engine: EngineProcess) -> list[str]:
    return sorted(str(p) for p in Path("/dev/shm").glob(f"fake_engine_{engine.pid}_*"))


async def _rank_files(engine: EngineProcess) -> list[str]:
    """The ranks' files, once both ranks mapped theirs (the engine is ready before)."""
    for _ in range(200):
        files = _fake_shm(engine)
        if len(files) == 2:  # one per rank, mapped and never unlinked by the engine
            return files
        await asyncio.sleep(0.02)
    raise AssertionError(f"the ranks' shared memory never appeared: {_fake_shm(engine)}")


async def _ready(command: str, **env: str) -> tuple[EngineProcess, dict[str, Any]]:
    port = free_port()
    engine = await EngineProcess.start(
        "org/m",
        _argv(command, port),
        _env(FAKE_ENGINE_CHILDREN="2", FAKE_ENGINE_SHM="1", **env),
        port,
        ranks=re.compile(r"^sglang::"),
    )
    async with httpx.AsyncClient() as client:
        await engine.wait_ready(client, "/health", timeout_s=30)
        info = (await client.get(f"{engine.base_url}/_fake/info")).json()
    return engine, info


@pytest.mark.anyio
async def test_a_stopped_engine_leaves_no_process_shared_memory_or_scratch_folder(
    fake_engine_minimal_command: str,
) -> None:
    engine, info = await _ready(fake_engine_minimal_command)
    files = await _rank_files(engine)
    scratch = Path(info["env"]["TMPDIR"])
    assert scratch.name.startswith("sie-engine-")
    assert _exist([str(scratch)]) == [str(scratch)]
    await engine.stop(grace_s=5)
    assert not group_members(engine.pid)
    assert _exist([*files, str(scratch)]) == []


@pytest.mark.anyio
async def test_a_rank_dying_ends_the_engine_naming_the_rank_and_its_stop_cleans_up(
    fake_engine_minimal_command: str,
) -> None:
    engine, info = await _ready(fake_engine_minimal_command)
    files = await _rank_files(engine)
    rank = info["children"][1]
    assert not engine.ended.done()
    os.kill(rank, signal.SIGKILL)
    why = await asyncio.wait_for(asyncio.shield(engine.ended), timeout=10)
    assert why == f"engine failed: its rank process 'sglang::scheduler_TP1' (pid {rank}) exited"
    assert engine.returncode is None  # the engine's main process still runs: the worker stops it
    await engine.stop(grace_s=5)
    assert not group_members(engine.pid)
    assert _exist(files) == []


@pytest.mark.anyio
async def test_an_engine_exiting_on_its_own_ends_with_its_code(
    fake_engine_minimal_command: str,
) -> None:
    # Two seconds after it is ready: with 0.2 a loaded machine sometimes lost the race
    # between the readiness poll (or _ready's info request) and the exit.
    engine, _ = await _ready(fake_engine_minimal_command, FAKE_ENGINE_CRASH_AFTER_S="2",
                             FAKE_ENGINE_CRASH_CODE="0")  # fmt: skip
    why = await asyncio.wait_for(asyncio.shield(engine.ended), timeout=15)
    assert why == "engine exited unexpectedly with code 0"  # status 0 is no request of ours
    await engine.stop(grace_s=5)


@pytest.mark.anyio
async def test_an_engine_on_cpu_devices_runs_with_its_ranks_on_their_cores(
    fake_engine_minimal_command: str,
) -> None:
    core = max(os.sched_getaffinity(0))
    port = free_port()
    engine = await EngineProcess.start(
        "org/m",
        _argv(fake_engine_minimal_command, port),
        _env(FAKE_ENGINE_CHILDREN="1"),
        port,
        cores=(core,),
    )
    try:
        async with httpx.AsyncClient() as client:
            await engine.wait_ready(client, "/health", timeout_s=30)
            info = (await client.get(f"{engine.base_url}/_fake/info")).json()
        assert os.sched_getaffinity(engine.pid) == {core}
        assert os.sched_getaffinity(info["children"][0]) == {core}  # inherited by its ranks
    finally:
        await engine.stop(grace_s=5)
