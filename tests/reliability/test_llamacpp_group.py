"""A real llama.cpp group of two nodes on one machine: two ``sie-worker serve`` processes as
ranks 0 and 1 (:class:`~tests.reliability._engine_group.Pair`), each on one core with one cpu
device, serving one pinned GGUF model of width 2. The follower runs ``ggml-rpc-server`` on the
group's port at its own address; the leader's ``llama-server`` names it with ``--rpc`` and
puts every layer on it. The leader answers; the follower refuses; killing the follower's RPC
server ends both workers, leaving nothing.

The group starts once for the module's tests, which run in order (the ``pytest llamacpp``
step of ``make test``).
"""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import psutil
import pytest

from tests.reliability._engine_group import Pair, complete, gone, readyz
from tests.reliability._support import Launcher, Worker, engine_of
from tests.support.llamacpp_models import LLAMACPP_BUNDLE, llamacpp_command, llamacpp_model
from tests.support.ports import free_port
from tests.support.tiny_gguf import write_tiny_gguf
from tests.support.worker_fixtures import wait_until

pytestmark = [pytest.mark.llamacpp, pytest.mark.slow]

MODEL = "tiny/llamacpp-group"
_READY_S = 120.0
_ENDED_S = 90.0


@pytest.fixture(scope="module")
def rpc_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def pair(
    module_launcher: Launcher, tmp_path_factory: pytest.TempPathFactory, rpc_port: int
) -> Pair:
    folder = write_tiny_gguf(tmp_path_factory.mktemp("gguf-group")).parent
    config = llamacpp_model(MODEL, folder, width=2, nccl_port=rpc_port)
    env = {"SIE_BUNDLE": LLAMACPP_BUNDLE, "SIE_LLAMACPP_COMMAND": llamacpp_command()}
    return Pair(module_launcher, config, env, (free_port(), free_port()), ready_s=_READY_S)


def _rpc_server(worker: Worker) -> psutil.Process:
    """The follower's engine: its worker's ``ggml-rpc-server`` child."""
    found: list[psutil.Process] = []

    def present() -> bool:
        children = psutil.Process(worker.process.pid).children()
        found[:] = [c for c in children if Path(c.cmdline()[0]).name == "ggml-rpc-server"]
        return bool(found)

    wait_until(present, timeout=30)
    return found[0]


def test_the_leader_answers_through_the_followers_rpc_server(pair: Pair, rpc_port: int) -> None:
    answer = complete(pair.leader, MODEL, ignore_eos=True)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["model"] == MODEL
    assert body["usage"]["completion_tokens"] == 6
    leading = engine_of(pair.leader, MODEL, timeout=30).cmdline()
    assert Path(leading[0]).name == "llama-server"
    assert leading[leading.index("--rpc") + 1] == f"127.0.0.1:{rpc_port}"
    following = _rpc_server(pair.follower).cmdline()
    assert following[following.index("-H") + 1] == "127.0.0.1"  # its own address, not 0.0.0.0
    assert following[following.index("-p") + 1] == str(rpc_port)


def test_the_follower_answers_409_not_leader(pair: Pair) -> None:
    refused = complete(pair.follower, MODEL)
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"]["code"] == "not_leader"
    assert readyz(pair.follower)[1]["rank"] == 1


def test_the_followers_rpc_server_killed_ends_both_workers(pair: Pair) -> None:
    leader, follower = pair.leader, pair.follower
    engines = [engine_of(leader, MODEL), _rpc_server(follower)]
    engines[1].send_signal(signal.SIGKILL)
    assert follower.process.wait(timeout=_ENDED_S) == 3
    # The leader's watch of its follower ends it (llama-server itself would abort only on
    # its next request); a request now gets an error or a closed connection, never a hang.
    try:
        answer = complete(leader, MODEL)
        assert answer.status_code >= 500, answer.text
    except httpx.HTTPError:
        pass
    assert leader.process.wait(timeout=_ENDED_S) == 3
    wait_until(lambda: gone(engines, set()), timeout=30)
