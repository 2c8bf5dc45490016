"""Load overhead: ``POST /v1/models/{id}/load`` until ready, minus the engine's own start-up.

The engine's own start-up is measured on the same command the worker runs (``sie-worker
plan`` prints it; only the ports differ): spawn it, poll ``GET /health`` every millisecond,
stop at the first 200. Worker loads and direct starts alternate, ``--rounds`` times, so
both see the same machine; each round's overhead is its load time minus its direct
start-up time. Target: median overhead <= 50 ms.

    .venv/bin/python -m tests.bench.bench_load [--rounds 10]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from tests.bench._bench import (
    MODEL,
    OUT,
    fake_engine_command,
    prepare,
    services,
    start_worker,
    summary,
    worker_env,
    write_result,
)
from tests.support import loopback
from tests.support.engine_fixtures import stop_process_group
from tests.support.ports import free_port

__all__ = ["main"]

_TARGET_S = 0.050
_HEALTH = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"


def _plan(config: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "sie_worker", "plan", config, "--devices", "cuda:0"],
        capture_output=True,
        text=True,
        env=worker_env(),
        check=True,
    )
    plan: dict[str, Any] = json.loads(done.stdout)
    return plan


def _with_ports(argv: Sequence[str]) -> list[str]:
    out = list(argv)
    for flag in ("--port", "--nccl-port"):
        if flag in out:
            out[out.index(flag) + 1] = str(free_port())
    return out


def _healthy(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as sock:
            sock.sendall(_HEALTH)
            return sock.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def _direct_start(plan: dict[str, Any]) -> float:
    argv = _with_ports(plan["argv"])
    port = int(argv[argv.index("--port") + 1])
    env = {**worker_env(), **plan["env"]}
    started = time.perf_counter()
    proc = subprocess.Popen(
        argv,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        while not _healthy(port):
            if proc.poll() is not None:
                raise RuntimeError(f"the engine exited with {proc.returncode} during start-up")
            time.sleep(0.001)
        return time.perf_counter() - started
    finally:
        stop_process_group(proc)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args(argv)
    prepare()
    config_dir = OUT / "load-configs"
    direct: list[float] = []
    loads: list[float] = []
    with services() as running:
        worker = start_worker("load-worker", config_dir)
        running.append(worker)
        plan = _plan(str(config_dir / (MODEL.replace("/", "--") + ".yaml")))
        with loopback.client(base_url=worker.url, timeout=120) as client:
            # One unmeasured round warms the page cache for both.
            _direct_start(plan)
            client.post(f"/v1/models/{MODEL}/load").raise_for_status()
            client.post(f"/v1/models/{MODEL}/unload").raise_for_status()
            for _ in range(args.rounds):
                direct.append(_direct_start(plan))
                started = time.perf_counter()
                response = client.post(f"/v1/models/{MODEL}/load")
                loads.append(time.perf_counter() - started)
                response.raise_for_status()
                if response.json().get("state") != "ready":
                    raise RuntimeError(f"load answered {response.text}")
                client.post(f"/v1/models/{MODEL}/unload").raise_for_status()
    overhead = [load - own for load, own in zip(loads, direct, strict=True)]
    median = statistics.median(overhead)
    result = {
        "command": "python -m tests.bench.bench_load " + " ".join(argv or sys.argv[1:]),
        "engine_command": fake_engine_command(),
        "rounds": args.rounds,
        "engine_start_s": summary(direct),
        "load_s": summary(loads),
        "overhead_s": {**summary(overhead), "median": median},
        "target": {
            "name": "load overhead (median)",
            "limit_s": _TARGET_S,
            "value_s": median,
            "met": median <= _TARGET_S,
        },
    }
    write_result("load", result)
    print(
        f"engine start-up median {statistics.median(direct) * 1000:.0f} ms, load median "
        f"{statistics.median(loads) * 1000:.0f} ms, overhead median {median * 1000:.0f} ms "
        f"(p90 {result['overhead_s']['p90'] * 1000:.0f} ms)"
    )
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
