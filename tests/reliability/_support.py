"""Shared pieces of the reliability suite: workers, engine bookkeeping and the end-state check.

Every fault test ends with :func:`assert_clean`, which checks, on the live worker:

- no device is claimed by a dead model (``/v1/devices`` and ``/v1/models`` agree, no device
  is claimed twice, unloaded and failed models hold no device);
- no engine process is left beyond the engines of the ready models, counting the rank
  processes an engine started (tracked by process group, so orphans that were reparented
  away from the worker are found too), and no zombie is left unreaped;
- no temp file is left in the config dir;
- the next request works.

Workers come from :class:`Launcher` (used by the ``launcher`` fixtures of ``conftest.py``);
it starts ``sie-worker serve`` with the fake SGLang engine, like the API tests' fixture, but
can also pass CLI arguments and be shared by a module's tests.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
from sie_worker.errors import (
    EngineTimeout,
    EngineUnavailable,
    LoadFailed,
    ModelLoading,
    PlacementFailed,
    SieError,
    StartupTimeout,
    UnknownModel,
)

from tests.support.ports import start_on_free_port
from tests.support.worker_fixtures import (
    WorkerProcess,
    wait_healthy,
    wait_until,
    write_config,
)

__all__ = [
    "LOAD_ERRORS",
    "WORKER_MARKER",
    "EngineBook",
    "Launcher",
    "Worker",
    "assert_clean",
    "assert_consistent",
    "complete",
    "engine_of",
    "error_statuses",
    "stream_events",
]

_BASE_ENV = {
    "FAKE_ENGINE_MAX_LIFETIME_S": "900",  # a safety net against orphans of a crashed run
    "SIE_BUNDLE": "sglang",
    "SIE_ENGINE_STOP_GRACE_S": "5",
    "SIE_DRAIN_TIMEOUT_S": "10",
    "HF_HUB_OFFLINE": "1",
    "SIE_WEIGHTS_DOWNLOAD": "engine",  # the fake engine needs no weights
    "PYTHONUNBUFFERED": "1",
}


# Every engine and rank inherits it from its worker: whose processes they are.
WORKER_MARKER = "RELIABILITY_TEST_WORKER"


# What any request to a busy worker may meet: its model loading, evicted, failing or slow.
LOAD_ERRORS: tuple[type[SieError], ...] = (
    UnknownModel,
    PlacementFailed,
    LoadFailed,
    EngineUnavailable,
    EngineTimeout,
    StartupTimeout,
    ModelLoading,
)


def error_statuses(*errors: type[SieError]) -> dict[str, int]:
    """``{code: HTTP status}`` of the errors a test accepts, as sie_worker.errors declares them."""
    return {error.code: error.status for error in errors}


@dataclass
class EngineBook:
    """Process groups of every engine a worker ran, to find survivors and orphans later.

    Process ids wrap around (32768 on small machines), so a recorded group id may be reused
    by someone else's process: a member counts only when it also carries this worker's
    marker variable, which every engine and rank inherits from the worker.
    """

    marker: str = field(default_factory=lambda: uuid.uuid4().hex)
    groups: set[int] = field(default_factory=set)

    def note(self, pids: Iterable[int]) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                self.groups.add(os.getpgid(pid))

    def members(self, groups: Iterable[int] | None = None) -> list[int]:
        """Live (non-zombie) processes in the given groups (default: every group seen)."""
        wanted = set(self.groups if groups is None else groups)
        found = []
        for process in psutil.process_iter(["status"]):
            if process.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            with contextlib.suppress(ProcessLookupError, psutil.Error):
                if (
                    os.getpgid(process.pid) in wanted
                    and process.environ().get(WORKER_MARKER) == self.marker
                ):
                    found.append(process.pid)
        return found


# How each engine is told the id it serves (llama.cpp: its alias).
_SERVED_NAME_FLAGS = ("--served-model-name", "--alias")


@dataclass
class Worker(WorkerProcess):
    """A worker process plus the engine groups seen under it."""

    book: EngineBook = field(default_factory=EngineBook)

    def engines(self) -> dict[str, int]:
        """Served model id -> pid of its engine's main process (the worker's children)."""
        found: dict[str, int] = {}
        try:
            children = psutil.Process(self.process.pid).children()
        except psutil.NoSuchProcess:
            return found
        for child in children:
            with contextlib.suppress(psutil.Error):
                if child.status() == psutil.STATUS_ZOMBIE:
                    continue
                argv = child.cmdline()
                for flag in _SERVED_NAME_FLAGS:
                    if flag in argv:
                        found[argv[argv.index(flag) + 1]] = child.pid
        self.book.note(found.values())
        return found

    def engine_pids(self) -> list[int]:
        pids = super().engine_pids()
        self.book.note(pids)
        return pids

    def zombie_children(self) -> list[int]:
        try:
            children = psutil.Process(self.process.pid).children()
        except psutil.NoSuchProcess:
            return []
        zombies = []
        for child in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                if child.status() == psutil.STATUS_ZOMBIE:
                    zombies.append(child.pid)
        return zombies

    def survivors(self, timeout: float = 15.0) -> list[int]:
        """Processes of any engine group still alive after the worker is gone."""
        self.engine_pids()
        deadline = time.monotonic() + timeout
        alive = self.book.members()
        while alive and time.monotonic() < deadline:
            time.sleep(0.1)
            alive = self.book.members()
        return alive


class Launcher:
    """Starts ``sie-worker serve`` subprocesses with the fake engine; stops them all at close."""

    def __init__(self, root: Path, engine_command: str) -> None:
        self.root = root
        self.engine_command = engine_command
        self.workers: list[Worker] = []

    def start(
        self,
        configs: Iterable[Mapping[str, Any]] = (),
        *,
        devices: str = "cuda:0,cuda:1",
        env: Mapping[str, str] | None = None,
        api_key: str | None = None,
        config_dir: Path | None = None,
        args: Iterable[str] = (),
        wait: bool = True,
        port: int | None = None,
        prefix: Iterable[str] = (),
    ) -> Worker:
        index = len(self.workers)
        directory = config_dir or self.root / f"configs-{index}"
        directory.mkdir(parents=True, exist_ok=True)
        for config in configs:
            write_config(directory, config)
        log_path = self.root / f"worker-{index}.log"
        full_env = {
            k: v for k, v in os.environ.items() if not k.startswith(("SIE_", "CUDA_VISIBLE"))
        }
        full_env.update(_BASE_ENV)
        full_env["SIE_SGLANG_COMMAND"] = self.engine_command
        full_env["SIE_DEVICES"] = devices
        if api_key:
            full_env["SIE_API_KEY"] = api_key
        full_env.update(env or {})
        book = EngineBook()
        full_env[WORKER_MARKER] = book.marker
        # ``prefix``: a command the worker runs under (``taskset -c 1``: a node of one core).
        serve = [sys.executable, "-m", "sie_worker", "serve", "--config-dir", str(directory)]
        argv = [*prefix, *serve]

        def launch(port: int) -> tuple[Worker, subprocess.Popen[bytes], Path]:
            with log_path.open("ab") as log:
                process = subprocess.Popen(
                    [*argv, "--port", str(port), *args],
                    env=full_env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            worker = Worker(process, port, directory, log_path, api_key, book=book)
            self.workers.append(worker)
            return worker, process, log_path

        def ready(worker: Worker) -> None:
            wait_healthy(worker, timeout=60.0)

        # A chosen port (a group's ranks name each other's) is never retried on another.
        return start_on_free_port(launch, ready if wait else None, port)

    def close(self) -> list[int]:
        """Stop every worker; return (after killing them) engine processes that outlived it."""
        leftovers: list[int] = []
        for worker in self.workers:
            if worker.process.poll() is None:
                with contextlib.suppress(AssertionError):
                    worker.stop()
            leftovers += worker.survivors()
        for pid in leftovers:
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(pid).kill()
        return leftovers


# --- requests ---------------------------------------------------------------------------


def complete(worker: WorkerProcess, model: str, **fake: Any) -> httpx.Response:
    body: dict[str, Any] = {"model": model, "prompt": "hello there", "max_tokens": 4}
    if fake:
        body["fake"] = fake
    with worker.client() as client:
        return client.post("/v1/completions", json=body)


def stream_events(
    worker: WorkerProcess,
    model: str,
    *,
    on_event: Any = None,
    path: str = "/v1/completions",
    **fake: Any,
) -> tuple[int, list[str]]:
    """Stream a completion; return the status and every ``data:`` payload, in order.

    ``on_event(index, payload)`` runs after each event (to inject a fault mid-stream).
    """
    body: dict[str, Any] = {"model": model, "max_tokens": 8, "stream": True}
    if path.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": "hello there"}]
    else:
        body["prompt"] = "hello there"
    if fake:
        body["fake"] = fake
    events: list[str] = []
    with (
        worker.client() as client,
        client.stream("POST", path, json=body) as response,
    ):
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(line[len("data: ") :])
                if on_event is not None:
                    on_event(len(events) - 1, events[-1])
        return response.status_code, events


def error_of(event: str) -> dict[str, Any] | None:
    """The ``error`` object of an SSE payload, if it is a DESIGN.md error event."""
    with contextlib.suppress(ValueError):
        payload = json.loads(event)
        if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
            error: dict[str, Any] = payload["error"]
            return error
    return None


def engine_of(worker: Worker, model: str, timeout: float = 10.0) -> psutil.Process:
    """The main process of ``model``'s engine (found by the served id on its command line:
    ``--served-model-name``, llama.cpp's ``--alias``)."""
    found: dict[str, int] = {}

    def present() -> bool:
        found.update(worker.engines())
        return model in found

    wait_until(present, timeout=timeout)
    return psutil.Process(found[model])


# --- the end-state check ------------------------------------------------------------------

_LIVE_STATES = ("loading", "ready")


def assert_consistent(
    models: Mapping[str, Mapping[str, Any]], devices: Mapping[str, str | None]
) -> None:
    """One snapshot: no device claimed twice, dead models hold nothing, the views agree."""
    claimed: dict[str, str] = {}
    for model in models.values():
        if model["state"] not in _LIVE_STATES:
            assert model["devices"] == [], f"{model['id']} is {model['state']} but holds devices"
        for device in model["devices"]:
            assert device not in claimed, (
                f"{device} claimed by both {claimed.get(device)} and {model['id']}"
            )
            claimed[device] = model["id"]
    held = {d: m for d, m in devices.items() if m is not None}
    assert held == claimed, f"/v1/devices {held} != /v1/models {claimed}"


def _settled(worker: Worker) -> bool:
    return all(m["state"] not in ("loading",) for m in worker.models().values())


def _strays(worker: Worker, ready: set[str]) -> list[str]:
    engines = worker.engines()
    unexpected = [f"engine of {m} (pid {p})" for m, p in engines.items() if m not in ready]
    missing = [f"no engine for ready model {m}" for m in ready if m not in engines]
    allowed = {os.getpgid(p) for m, p in engines.items() if m in ready}
    orphans = [
        f"pid {p} of a stopped engine's process group"
        for p in worker.book.members(worker.book.groups - allowed)
    ]
    zombies = [f"unreaped zombie {p}" for p in worker.zombie_children()]
    return unexpected + missing + orphans + zombies


def assert_clean(worker: Worker, probe: str | None) -> None:
    """The shared end state of every fault test (see the module docstring).

    ``probe`` is a generation model that must serve the next request (None: skip that).
    """
    worker.engine_pids()
    wait_until(lambda: _settled(worker), timeout=60)
    models, devices = worker.models(), worker.devices()
    assert_consistent(models, devices)
    ready = {m for m, entry in models.items() if entry["state"] == "ready"}
    problems: list[str] = []

    def no_strays() -> bool:
        problems[:] = _strays(worker, ready)
        return not problems

    try:
        wait_until(no_strays, timeout=20)
    except AssertionError:
        # The states now and the log's end say which path left the engine behind.
        states = {m: entry["state"] for m, entry in worker.models().items()}
        tail = "\n".join(worker.logs().splitlines()[-60:])
        raise AssertionError(
            f"engine processes left behind: {problems}; ready when checked: {sorted(ready)}; "
            f"states now: {states}; the worker's log ends:\n{tail}"
        ) from None
    temp = [str(p) for p in worker.config_dir.rglob(".*")]
    assert not temp, f"temp files left in the config dir: {temp}"
    if probe is not None:
        response = complete(worker, probe)
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["text"]


def sigcont_quietly(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)
