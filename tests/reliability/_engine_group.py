"""What the real-engine tests read of a worker's engine: its process group, its rank
processes, the shared memory they map, and requests through the worker. Shared by the modules
that run vLLM's CPU build and SGLang on cpu devices through workers (test_vllm_engine,
test_vllm_pipeline, test_vllm_group, test_sglang_engine)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil

from tests.reliability._support import Worker, engine_of
from tests.support.worker_fixtures import WorkerProcess

__all__ = [
    "SHM",
    "complete",
    "engine_group",
    "gone",
    "load",
    "rank_processes",
    "shared_memory",
    "shm_left",
    "stream",
    "vllm_shm_left",
]

SHM = Path("/dev/shm")


def load(worker: WorkerProcess, model: str) -> httpx.Response:
    with worker.client(timeout=300) as client:
        return client.post(f"/v1/models/{model}/load")


def engine_group(worker: Worker, model: str) -> list[psutil.Process]:
    """Every live process of the model's engine group (its API server first)."""
    main = engine_of(worker, model)
    members = [main]
    for process in psutil.process_iter(["status"]):
        if process.pid == main.pid or process.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        with contextlib.suppress(ProcessLookupError):
            if os.getpgid(process.pid) == main.pid:
                members.append(process)
    return members


def rank_processes(
    group: list[psutil.Process], prefix: str = "VLLM::Worker_"
) -> dict[str, psutil.Process]:
    """``{"VLLM::Worker_TP0": process, ...}`` (``Worker_PP0`` for pipeline stages;
    ``prefix="sglang::scheduler_"`` for SGLang's ranks): the group's rank processes by title."""
    found = {}
    for process in group:
        with contextlib.suppress(psutil.Error):
            title = (process.cmdline() or [""])[0]
            if title.startswith(prefix):
                found[title] = process
    return found


def shared_memory(group: list[psutil.Process]) -> set[Path]:
    """The /dev/shm files the group maps."""
    found: set[Path] = set()
    for process in group:
        try:
            maps = process.memory_maps(grouped=False)
        except psutil.Error:
            continue
        found |= {Path(m.path) for m in maps if m.path.startswith(f"{SHM}/")}
    return found


def gone(group: list[psutil.Process], files: set[Path]) -> bool:
    """No process of the group is alive and none of ``files`` is left."""
    alive = []
    for process in group:
        with contextlib.suppress(psutil.NoSuchProcess):
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process)
    return not alive and not [f for f in files if f.exists()]


def complete(worker: WorkerProcess, model: str, **body: Any) -> httpx.Response:
    with worker.client(timeout=300) as client:
        return client.post(
            "/v1/completions", json={"model": model, "prompt": "Hello", "max_tokens": 6, **body}
        )


def stream(worker: WorkerProcess, path: str, body: dict[str, Any]) -> list[str]:
    """The ``data:`` payloads of a streamed answer (which must be a 200)."""
    events: list[str] = []
    with worker.client(timeout=300) as client, client.stream("POST", path, json=body) as answer:
        assert answer.status_code == 200
        for line in answer.iter_lines():
            if line.startswith("data: "):
                events.append(line[len("data: ") :])
    return events


@contextlib.contextmanager
def shm_left(*patterns: str) -> Iterator[None]:
    """Fails when files of these glob patterns appeared in /dev/shm inside the block and
    stayed."""
    before = {path for pattern in patterns for path in SHM.glob(pattern)}
    yield
    left = {path for pattern in patterns for path in SHM.glob(pattern)} - before
    assert not left, f"shared memory of engines left behind: {sorted(left)}"


def vllm_shm_left() -> contextlib.AbstractContextManager[None]:
    """:func:`shm_left` of vLLM's files."""
    return shm_left("vllm*")
