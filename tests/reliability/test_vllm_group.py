"""A real group of two nodes on one machine: two ``sie-worker serve`` processes as ranks 0
and 1 (``SIE_NODES=2``, ``SIE_LEADER_ADDRESS=127.0.0.1``, ``SIE_NODE_ADDRESSES`` naming both
workers), each on one core with one cpu device, serving one pinned vLLM model of two
pipeline stages: one stage in each worker's engine (the follower's runs ``vllm serve
--headless``). The leader answers through both processes; the follower refuses; killing
the follower's engine ends both workers, leaving nothing; a new pair serves again.

The group starts once for the module's tests, which run in order (the ``pytest vllm`` step
of ``make test``). docs/groups-of-nodes.md shows such a run; the first test checks it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.reliability._engine_group import (
    Pair,
    engine_group,
    gone,
    rank_processes,
    readyz,
    shared_memory,
    vllm_shm_left,
)
from tests.reliability._support import Launcher, Worker, engine_of
from tests.support.ports import free_port
from tests.support.repo import ROOT
from tests.support.vllm_engine import vllm_command, vllm_model
from tests.support.worker_fixtures import wait_until

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

MODEL = "tiny/llama-pp2-group"
PAGE = ROOT / "docs" / "groups-of-nodes.md"
_READY_S = 300.0  # two vLLM processes starting side by side on two cores
_ENDED_S = 90.0  # the bound: both workers gone after a follower's engine is killed


def _pair(launcher: Launcher, model_dir: Path) -> Pair:
    config = vllm_model(
        MODEL, model_dir, pipeline_parallel_size=2, enforce_eager=False, nccl_port=free_port()
    )
    env = {
        "SIE_BUNDLE": "vllm",
        "SIE_VLLM_COMMAND": vllm_command(),
        # The ranks find each other on loopback (a pod would use its own address).
        "VLLM_HOST_IP": "127.0.0.1",
        "GLOO_SOCKET_IFNAME": "lo",
    }
    return Pair(launcher, config, env, (free_port(), free_port()), ready_s=_READY_S)


def _post(worker: Worker, path: str, body: dict[str, Any], timeout: float = 300) -> httpx.Response:
    with worker.client(timeout=timeout) as client:
        return client.post(path, json=body)


def _complete(worker: Worker, timeout: float = 300) -> httpx.Response:
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 6}
    return _post(worker, "/v1/completions", body, timeout)


@pytest.fixture(scope="module")
def pair(module_launcher: Launcher, tiny_vllm_llama_dir: Path) -> Pair:
    return _pair(module_launcher, tiny_vllm_llama_dir)


@pytest.fixture(scope="module", autouse=True)
def _no_vllm_shared_memory_left(module_launcher: Launcher) -> Iterator[None]:
    with vllm_shm_left(module_launcher):
        yield


def _engine_argv(worker: Worker) -> list[str]:
    return engine_of(worker, MODEL, timeout=30).cmdline()


def test_the_leader_answers_through_a_model_split_across_both_processes(pair: Pair) -> None:
    leader, follower = pair.leader, pair.follower
    completion = _complete(leader)
    assert completion.status_code == 200, completion.text
    body = completion.json()
    assert body["model"] == MODEL
    assert body["usage"]["completion_tokens"] == 6
    chat = _post(
        leader,
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
    )
    assert chat.status_code == 200, chat.text
    # Rank 0's engine is the API server with stage 0; rank 1's a headless `vllm serve`.
    leading, following = _engine_argv(leader), _engine_argv(follower)
    assert "vllm.entrypoints.openai.api_server" in leading
    assert leading[leading.index("--node-rank") + 1] == "0"
    assert following[following.index("-m") + 1 : following.index("-m") + 3] == [
        "vllm.entrypoints.cli.main",
        "serve",
    ]
    assert "--headless" in following
    assert following[following.index("--node-rank") + 1] == "1"
    stages = {
        title: process
        for worker in (leader, follower)
        for title, process in rank_processes(engine_group(worker, MODEL)).items()
    }
    assert sorted(stages) == ["VLLM::Worker_PP0", "VLLM::Worker_PP1"]
    assert stages["VLLM::Worker_PP0"].cpu_affinity() == [0]
    assert stages["VLLM::Worker_PP1"].cpu_affinity() == [1]
    _the_page_shows_this_run(pair, body)


def _the_page_shows_this_run(pair: Pair, completion: dict[str, Any]) -> None:
    """docs/groups-of-nodes.md's transcript of such a run: its /readyz answers are these
    workers', and its completion has this one's shape (the text of random weights aside)."""
    [block] = re.findall(
        r"<!-- tested-by: tests/reliability/test_vllm_group.py::"
        r"test_the_leader_answers_through_a_model_split_across_both_processes -->\n"
        r"```console\n(.*?)```",
        PAGE.read_text(encoding="utf-8"),
        re.S,
    )
    shown = _answers(block)
    ports = {"8080": pair.leader, "8081": pair.follower}
    readys = [(port, answer) for port, path, answer in shown if path == "/readyz"]
    assert [port for port, _ in readys] == ["8080", "8081"], shown
    for port, answer in readys:
        assert answer == readyz(ports[port])[1]
    [(_, _, page_completion)] = [a for a in shown if a[1] == "/v1/completions"]
    assert _shape(page_completion) == _shape(completion)
    [(_, _, refusal)] = [a for a in shown if a[1] == "/v1/completions -follower"]
    answer = _complete(pair.follower)
    assert answer.status_code == 409
    live = answer.json()
    assert refusal == live


def _answers(block: str) -> list[tuple[str, str, Any]]:
    """``(port, path, JSON answer)`` of every ``curl`` in a console block (a completion sent
    to the follower is told apart by a `` -follower`` suffix on its path)."""
    found: list[tuple[str, str, Any]] = []
    commands = re.split(r"^\$ ", block, flags=re.M)[1:]
    for command in commands:
        head, _, output = command.partition("\n")
        while head.endswith("\\"):
            more, _, output = output.partition("\n")
            head = head[:-1] + more
        match = re.search(r"localhost:(\d+)(/\S*)", head)
        assert match is not None, head
        port, path = match.group(1), match.group(2).rstrip("'\"")
        if path == "/v1/completions" and port == "8081":
            path += " -follower"
        # The page folds long answers at spaces and commas: a line break reads as a space.
        found.append((port, path, json.loads(" ".join(output.split("\n")))))
    return found


def _shape(value: Any) -> Any:
    """A JSON answer with what differs from run to run (ids, times, text) blanked."""
    if isinstance(value, dict):
        return {
            k: "..." if k in ("id", "created", "text", "system_fingerprint") else _shape(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_shape(v) for v in value]
    return value


def test_the_follower_answers_409_not_leader_naming_the_leader(pair: Pair) -> None:
    refused = _complete(pair.follower)
    assert refused.status_code == 409, refused.text
    error = refused.json()["error"]
    assert error["code"] == "not_leader"
    assert "rank 1 of a group of 2 nodes" in error["message"]
    assert readyz(pair.follower)[1]["rank"] == 1


def test_the_followers_engine_killed_ends_both_workers_and_requests_in_flight_get_an_error(
    pair: Pair,
) -> None:
    leader, follower = pair.leader, pair.follower
    groups = [engine_group(worker, MODEL) for worker in (leader, follower)]
    files = set().union(*(shared_memory(group) for group in groups))
    answers: list[httpx.Response | Exception] = []

    def in_flight() -> None:
        try:
            answers.append(_complete(leader, timeout=_ENDED_S))
        except Exception as exc:  # a hang (ReadTimeout) is what must not happen
            answers.append(exc)

    # A real vLLM leader keeps answering /health after losing its follower, and hangs a
    # request sent to it: only the leader's worker, watching its follower, can end it.
    os.killpg(groups[1][0].pid, signal.SIGKILL)
    asker = threading.Thread(target=in_flight)
    asker.start()
    assert follower.process.wait(timeout=_ENDED_S) == 3
    assert leader.process.wait(timeout=_ENDED_S) == 3
    asker.join(timeout=_ENDED_S)
    assert not asker.is_alive()
    [answer] = answers
    if isinstance(answer, httpx.Response):
        assert answer.status_code >= 500, answer.text
        assert answer.json()["error"]["code"]
    else:  # the worker ended while the request waited for its turn: the connection closed
        assert isinstance(answer, httpx.RemoteProtocolError | httpx.ConnectError), repr(answer)
    assert "lost rank 1 of the group" in leader.logs()
    assert "so the group restarts whole" in follower.logs()
    for group in groups:
        wait_until(lambda g=group: gone(g, files), timeout=30)


def test_a_restarted_pair_serves_again(
    module_launcher: Launcher, tiny_vllm_llama_dir: Path
) -> None:
    again = _pair(module_launcher, tiny_vllm_llama_dir)
    answer = _complete(again.leader)
    assert answer.status_code == 200, answer.text
    # A clean stop of the pair leaves nothing either (the follower first: the leader's watch
    # may then end it before its own SIGTERM, with status 3).
    workers = (again.follower, again.leader)
    groups = [engine_group(worker, MODEL) for worker in workers]
    files = set().union(*(shared_memory(group) for group in groups))
    for worker in workers:
        with contextlib.suppress(ProcessLookupError):
            worker.process.send_signal(signal.SIGTERM)
        assert worker.process.wait(timeout=_ENDED_S) in (0, 3)
    for group in groups:
        wait_until(lambda g=group: gone(g, files), timeout=30)
