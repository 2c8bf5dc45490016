"""What the real-engine tests read of a worker's engine: its process group, its rank
processes, the shared memory they map, and requests through the worker. Shared by the modules
that run vLLM's CPU build, SGLang and llama.cpp on cpu devices through workers
(test_vllm_engine, test_vllm_pipeline, test_vllm_group, test_sglang_engine,
test_sglang_models, test_llamacpp_engine, test_llamacpp_group), and the two ranks of a group
of nodes on one machine (:class:`Pair`)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil

from tests.reliability._support import WORKER_MARKER, Launcher, Worker, engine_of
from tests.support.sglang_engine import SGLANG_BUNDLE, SGLANG_SHM, sglang_command
from tests.support.worker_fixtures import WorkerProcess, wait_until

__all__ = [
    "SHM",
    "Pair",
    "complete",
    "engine_group",
    "gone",
    "load",
    "rank_processes",
    "readyz",
    "sglang_shm_left",
    "shared_memory",
    "shm_left",
    "start_sglang_worker",
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
def shm_left(*patterns: str, launcher: Launcher) -> Iterator[None]:
    """Fails when files of these glob patterns appeared in /dev/shm inside the block and
    stayed, once the engines of ``launcher``'s workers are gone.

    Real-engine modules run side by side (``pytest vllm`` runs two at once): a file that a
    live engine of another module maps is that module's; one that no one maps gets 30 s to
    go (another module's engine may be removing its own), then counts as left."""
    before = {path for pattern in patterns for path in SHM.glob(pattern)}
    yield

    def left() -> set[Path]:
        new = {path for pattern in patterns for path in SHM.glob(pattern)} - before
        return new - _mapped_by_others(launcher) if new else new

    deadline = time.monotonic() + 30
    while left() and time.monotonic() < deadline:
        time.sleep(0.5)
    remaining = left()
    assert not remaining, f"shared memory of engines left behind: {sorted(remaining)}"


def _mapped_by_others(launcher: Launcher) -> set[Path]:
    """The /dev/shm files mapped by live engines of workers ``launcher`` did not start."""
    ours = {worker.book.marker for worker in launcher.workers}
    found: set[Path] = set()
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            marker = process.environ().get(WORKER_MARKER)
            if marker and marker not in ours:
                found |= shared_memory([process])
    return found


@contextlib.contextmanager
def sglang_shm_left(worker: Worker, launcher: Launcher) -> Iterator[None]:
    """:func:`shm_left` of SGLang's files, checked once ``worker`` has stopped (whatever
    engine it still ran goes with it)."""
    with shm_left(*SGLANG_SHM, launcher=launcher):
        yield
        worker.stop()


def start_sglang_worker(launcher: Launcher, configs: list[dict[str, Any]], **env: str) -> Worker:
    """A worker on ``cpu:0,cpu:1`` whose SGLang is the real one (``.venv-sglang``)."""
    settings = {
        "SIE_BUNDLE": SGLANG_BUNDLE,
        "SIE_SGLANG_COMMAND": sglang_command(),
        "SIE_ENGINE_STOP_GRACE_S": "15",
        **env,
    }
    return launcher.start(configs, devices="cpu:0,cpu:1", env=settings)


def vllm_shm_left(launcher: Launcher) -> contextlib.AbstractContextManager[None]:
    """:func:`shm_left` of vLLM's files."""
    return shm_left("vllm*", launcher=launcher)


class Pair:
    """The two ranks of a group of nodes on one machine: two workers (``SIE_NODES=2``, the
    leader at 127.0.0.1, ``SIE_NODE_ADDRESSES`` naming both), each on one core with one cpu
    device, serving the pinned ``config``; ``env`` the engine's settings. The follower starts
    first (its engine waits for the leader's, or the leader's for its server)."""

    def __init__(
        self,
        launcher: Launcher,
        config: dict[str, Any],
        env: dict[str, str],
        ports: tuple[int, int],
        *,
        ready_s: float,
    ) -> None:
        addresses = ",".join(f"127.0.0.1:{port}" for port in ports)
        workers: dict[int, Worker] = {}
        for rank in (1, 0):
            group = {
                "SIE_NODES": "2",
                "SIE_NODE_RANK": str(rank),
                "SIE_LEADER_ADDRESS": "127.0.0.1",
                "SIE_NODE_ADDRESSES": addresses,
                "SIE_PINNED_MODELS": config["sie_id"],
                "SIE_ENGINE_STOP_GRACE_S": "10",
            }
            workers[rank] = launcher.start(
                [config],
                devices=f"cpu:{rank}",
                env={**group, **env},
                port=ports[rank],
                prefix=("taskset", "-c", str(rank)),  # a node of one core
            )
        self.leader, self.follower = workers[0], workers[1]
        for worker in (self.follower, self.leader):
            wait_until(lambda w=worker: readyz(w)[0] == 200, timeout=ready_s)


def readyz(worker: Worker) -> tuple[int, dict[str, Any]]:
    """The worker's ``/readyz`` status and body (0 and {} when it does not answer)."""
    with worker.client(timeout=10) as client:
        try:
            answer = client.get("/readyz")
        except httpx.HTTPError:
            return 0, {}
    return answer.status_code, answer.json()
