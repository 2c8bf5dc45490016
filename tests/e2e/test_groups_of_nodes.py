"""A group of nodes on loopback: two or three ``sie-worker serve`` processes as ranks
(``SIE_NODES``, ``SIE_NODE_RANK``, ``SIE_LEADER_ADDRESS=127.0.0.1``), each with one fake GPU,
serving one pinned model twice as wide as a worker (or three times) through the fake SGLang
engine's multi-node flags: ranks >= 1 join rank 0's rendezvous port, rank 0 is ready only
when all have joined, and one rank's engine dying ends that rank's worker and fails the
group.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

import psutil
import pytest

from tests.support.ports import free_port
from tests.support.worker_fixtures import WorkerProcess, fake_model, wait_until

pytestmark = pytest.mark.slow  # each test starts two or three workers and their engines

MODEL = "org/group-model"
_STARTED = 60.0  # the group's start on a busy shared machine


def _rank(
    start_worker: Callable[..., WorkerProcess],
    config: dict[str, Any],
    nodes: int,
    rank: int,
    ports: list[int] | None = None,
) -> WorkerProcess:
    """Rank ``rank``; with ``ports`` (every rank's, in rank order) the ranks watch each other
    at ``SIE_NODE_ADDRESSES``, on this rank's port."""
    env = {
        "SIE_NODES": str(nodes),
        "SIE_NODE_RANK": str(rank),
        "SIE_LEADER_ADDRESS": "127.0.0.1",
        "SIE_PINNED_MODELS": MODEL,
    }
    if ports is None:
        return start_worker([config], devices="cuda:0", env=env)
    env["SIE_NODE_ADDRESSES"] = ",".join(f"127.0.0.1:{port}" for port in ports)
    return start_worker([config], devices="cuda:0", env=env, port=ports[rank])


def _group(start_worker: Callable[..., WorkerProcess], nodes: int) -> list[WorkerProcess]:
    """Start ranks N-1..0 (followers first: they wait for the leader), each on cuda:0, each
    watching the others."""
    config = fake_model(MODEL, width=nodes, nccl_port=free_port())
    ports = [free_port() for _ in range(nodes)]
    workers = {
        rank: _rank(start_worker, config, nodes, rank, ports) for rank in reversed(range(nodes))
    }
    ranks = [workers[rank] for rank in range(nodes)]
    for worker in ranks:
        wait_until(lambda w=worker: _readyz(w)[0] == 200, timeout=_STARTED)
    return ranks


def _readyz(worker: WorkerProcess) -> tuple[int, dict[str, Any]]:
    with worker.client() as client:
        response = client.get("/readyz")
    return response.status_code, response.json()


def _complete(worker: WorkerProcess) -> tuple[int, dict[str, Any]]:
    with worker.client() as client:
        response = client.post(
            "/v1/completions", json={"model": MODEL, "prompt": "one two three", "max_tokens": 4}
        )
    return response.status_code, response.json()


def _engine_info(worker: WorkerProcess) -> dict[str, Any]:
    with worker.client() as client:
        entry = client.get(f"/v1/models/{MODEL}").json()
    assert entry["state"] == "loaded", entry
    return entry


def _engine(worker: WorkerProcess) -> psutil.Process:
    """The rank's engine: the worker's one child process."""
    children = psutil.Process(worker.process.pid).children()
    assert len(children) == 1, children
    worker.engine_pids()
    return children[0]


def test_a_group_of_two_serves_at_the_leader_and_refuses_at_the_follower(
    start_worker: Callable[..., WorkerProcess],
) -> None:
    leader, follower = _group(start_worker, 2)
    status, body = _complete(leader)
    assert status == 200, body
    assert body["choices"][0]["text"]
    status, body = _complete(follower)
    assert status == 409
    assert body["error"]["code"] == "not_leader"
    assert "rank 1 of a group of 2 nodes" in body["error"]["message"]
    assert "127.0.0.1" in body["error"]["message"]
    assert _readyz(leader)[1] == {"status": "ready", "rank": 0, "nodes": 2, "leader": "127.0.0.1"}
    assert _readyz(follower)[1] == {
        "status": "ready",
        "rank": 1,
        "nodes": 2,
        "leader": "127.0.0.1",
    }
    # Each rank claims width / N = 1 of its devices, from cuda:0; the model's width is whole.
    for worker in (leader, follower):
        assert worker.devices() == {"cuda:0": MODEL}
        assert _engine_info(worker)["width"] == 2
    argv = _engine(follower).cmdline()
    assert argv[argv.index("--node-rank") + 1] == "1"
    assert argv[argv.index("--nnodes") + 1] == "2"


def test_the_leader_is_ready_only_when_every_rank_has_joined(
    start_worker: Callable[..., WorkerProcess],
) -> None:
    config = fake_model(MODEL, width=2, nccl_port=free_port())
    leader = _rank(start_worker, config, 2, 0)
    wait_until(lambda: "Uvicorn running" in leader.logs(), timeout=_STARTED)
    status, body = _readyz(leader)
    assert (status, body["waiting_for"], body["rank"]) == (503, [MODEL], 0)
    follower = _rank(start_worker, config, 2, 1)
    for worker in (leader, follower):
        wait_until(lambda w=worker: _readyz(w)[0] == 200, timeout=_STARTED)
    assert "rank 1 joined the group (2/2)" in leader.logs()


def test_a_follower_engine_dying_ends_its_worker_and_fails_the_group(
    start_worker: Callable[..., WorkerProcess],
) -> None:
    leader, middle, last = _group(start_worker, 3)
    assert _complete(leader)[0] == 200
    os.kill(_engine(last).pid, signal.SIGKILL)
    # The rank's worker exits non-zero (its pod restarts, and with it the whole group) ...
    assert last.process.wait(timeout=60) == 3
    assert "so the group restarts whole" in last.logs()
    # ... and the other ranks' engines lose the group, so their workers end too.
    assert leader.process.wait(timeout=60) == 3
    assert middle.process.wait(timeout=60) == 3
    assert "lost rank 2 of the group" in leader.logs()


def test_a_follower_that_stops_answering_ends_the_leader_even_when_its_engine_does_not_notice(
    start_worker: Callable[..., WorkerProcess],
) -> None:
    # A stopped follower keeps its engine's links open, so the leader's engine sees nothing
    # (as a real vLLM leader sees nothing of a lost follower): only the watch can tell.
    leader, follower = _group(start_worker, 2)
    assert _complete(leader)[0] == 200
    wait_until(lambda: "watching rank 1 of the group at http://127.0.0.1:" in leader.logs())
    os.kill(follower.process.pid, signal.SIGSTOP)
    try:
        assert leader.process.wait(timeout=60) == 3
    finally:
        os.kill(follower.process.pid, signal.SIGCONT)
    logs = leader.logs()
    assert "rank 0 lost rank 1 of the group (its worker at http://127.0.0.1:" in logs
    assert "so the group restarts whole" in logs
    # The follower's engine then loses its leader, and the follower's worker ends too.
    assert follower.process.wait(timeout=60) == 3
