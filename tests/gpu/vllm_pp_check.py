"""Pipeline parallelism through the worker on GPUs (``vllm_check.py --pp``; needs two GPUs).

- PP=2 on one worker: ``tensor_parallel_size: 1, pipeline_parallel_size: 2`` on its two
  devices; the engine gets ``--pipeline-parallel-size 2`` and answers a completion.
- PP=2 across two workers as a group of nodes on loopback (``SIE_NODES=2``,
  ``SIE_LEADER_ADDRESS=127.0.0.1``), rank 0 on the first GPU, rank 1 on the second: rank 1's
  engine runs headless (``vllm serve --headless``); the leader answers a completion, the
  follower answers 409 ``not_leader`` and its ``/readyz`` names rank 1; killing the follower's
  engine ends its worker with status 3, and the leader's (the group restarts whole).

vLLM's CPU build (0.32.0) cannot run pipeline parallelism (the last stage's
``sync_and_gather_intermediate_tensors`` asserts on the first request), so these are
skipped without two GPUs, ``--allow-cpu`` or not.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.gpu.gpu_check import _expect, check, free_port, http
from tests.gpu.vllm_check import MODEL, _start_worker, _write_config

__all__ = ["pipeline_checks"]


def _engine_argv(worker_pid: int) -> tuple[int, list[str]]:
    """The worker's engine: its child process, and its command line."""
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            if int(stat[stat.rfind(")") + 2 :].split()[1]) == worker_pid:
                return int(entry.name), (entry / "cmdline").read_bytes().decode().split("\0")
    raise AssertionError(f"worker {worker_pid} runs no engine")


def _answer(method: str, url: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        url, data=data, method=method, headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _wait_ready(url: str, timeout: float = 900) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            status, body = _answer("GET", url + "/readyz")
            if status == 200:
                return dict(body)
        time.sleep(2)
    raise AssertionError(f"{url} not ready within {timeout:g}s")


def _complete(url: str) -> str:
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 8}
    answer = http("POST", f"{url}/v1/completions", body, timeout=300)
    usage = answer["usage"]["completion_tokens"]
    return _expect(usage == 8, f"8 tokens: {answer['choices'][0]['text']!r}")


def pipeline_checks(llama: Path, devices: list[str], command: str, work: Path) -> None:
    if len(devices) < 2 or not devices[0].startswith("cuda"):
        print("SKIP  pipeline parallelism: needs two GPUs (vLLM's CPU build has no PP)")
        return
    one = work / "pp-one"
    _write_config(one / "configs", llama, 1, stages=2)
    worker, url = _start_worker(one / "configs", ",".join(devices[:2]), command, one / "w.log")
    try:

        def load() -> str:
            entry = http("POST", f"{url}/v1/models/{MODEL}/load", {}, timeout=900)
            _expect(entry["state"] == "ready", f"state {entry['state']}: {entry.get('error')}")
            _, argv = _engine_argv(worker.pid)
            stages = argv[argv.index("--pipeline-parallel-size") + 1]
            return _expect(stages == "2", f"--pipeline-parallel-size {stages} on {devices[:2]}")

        if check("PP=2 on one worker loads", load):
            check("PP=2 on one worker answers /v1/completions", lambda: _complete(url))
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=120)
    _group_checks(llama, devices[:2], command, work / "pp-group")


def _group_checks(llama: Path, devices: list[str], command: str, work: Path) -> None:
    _write_config(work / "configs", llama, 1, stages=2, nccl_port=free_port())
    ranks: list[tuple[Any, str]] = []
    ports = [free_port(), free_port()]
    try:
        for rank in (1, 0):  # the follower first: it waits for the leader
            env = {
                "SIE_NODES": "2",
                "SIE_NODE_RANK": str(rank),
                "SIE_LEADER_ADDRESS": "127.0.0.1",
                # The ranks watch each other's workers (a leader's engine may not notice).
                "SIE_NODE_ADDRESSES": ",".join(f"127.0.0.1:{port}" for port in ports),
                "SIE_PINNED_MODELS": MODEL,
            }
            log = work / f"rank{rank}.log"
            worker = _start_worker(
                work / "configs", devices[rank], command, log, env, port=ports[rank]
            )
            ranks.append(worker)
        (follower, follower_url), (leader, leader_url) = ranks

        def ready() -> str:
            found = [_wait_ready(u)["rank"] for u in (leader_url, follower_url)]
            return _expect(found == [0, 1], f"/readyz ranks {found}")

        if not check("PP=2 across two workers: every rank ready", ready):
            return
        check("the group's leader answers /v1/completions", lambda: _complete(leader_url))

        def refused() -> str:
            body = {"model": MODEL, "prompt": "Hello", "max_tokens": 2}
            status, answer = _answer("POST", follower_url + "/v1/completions", body)
            code = answer["error"]["code"]
            return _expect((status, code) == (409, "not_leader"), f"{status} {code}")

        check("the follower answers 409 not_leader", refused)

        def headless() -> str:
            _, argv = _engine_argv(follower.pid)
            return _expect("--headless" in argv and "serve" in argv, " ".join(argv[1:5]))

        check("the follower's engine runs `vllm serve --headless`", headless)

        def rank_dies() -> str:
            pid, _ = _engine_argv(follower.pid)
            os.killpg(os.getpgid(pid), signal.SIGKILL)
            code = follower.wait(timeout=120)
            return _expect(code == 3, f"follower worker exit {code}")

        if check("a rank's engine dying ends its worker with status 3", rank_dies):
            check(
                "the leader's engine loses the group and its worker ends with status 3",
                lambda: _expect(leader.wait(timeout=300) == 3, f"exit {leader.returncode}"),
            )
    finally:
        for process, _ in ranks:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                with contextlib.suppress(Exception):
                    process.wait(timeout=120)
