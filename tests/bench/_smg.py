"""SGLang's Rust router (``sglang-router``, "smg") in one hop's place, for the benchmarks'
anchor cells: installed from ``requirements/bench-smg.txt`` (pinned, hash-checked) into its
own venv, ``tests/bench/out/smg-venv``, the first time a benchmark asks for it."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx

from tests.bench._bench import OUT, ROOT, Service, spawn, wait_http
from tests.support import loopback
from tests.support.ports import free_port

__all__ = ["smg_python", "start_smg"]

_VENV = OUT / "smg-venv"
_LOCK = ROOT / "requirements" / "bench-smg.txt"


def smg_python() -> str | None:
    """The venv's python with ``sglang-router`` installed; None when it cannot be made
    (no network, say): the benchmark leaves the smg cell out."""
    python = _VENV / "bin" / "python"
    uv = ROOT / ".venv" / "bin" / "uv"
    if not python.exists():
        made = subprocess.run(
            [str(uv), "venv", "-q", "-p", "3.11", str(_VENV)], capture_output=True, check=False
        )
        if made.returncode != 0:
            return None
    installed = subprocess.run(
        [str(uv), "pip", "install", "-q", "-p", str(python), "--require-hashes", "-r", str(_LOCK)],
        capture_output=True,
        text=True,
        check=False,
    )
    if installed.returncode != 0:
        print(f"smg: not installed ({installed.stderr.strip()[-300:]})", file=sys.stderr)
        return None
    return str(python)


def start_smg(python: str, engine_port: int, cpus: set[int] | None) -> tuple[Service, str]:
    """smg in front of the engine, as the issue names it: round robin, no health checks."""
    port = free_port()
    argv = [
        python, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
        "--worker-urls", f"http://127.0.0.1:{engine_port}", "--policy", "round_robin",
        "--disable-health-check", "--log-level", "warn",
    ]  # fmt: skip
    service = spawn("smg", argv, port=port, env=os.environ, cpus=cpus)
    wait_http(service.url + "/health", proc=service.proc)
    deadline = time.monotonic() + 30
    body = {"model": "any", "prompt": "a b", "max_tokens": 2, "fake": {"fast": True}}
    while True:
        try:
            if loopback.post(service.url + "/v1/completions", json=body, timeout=10).is_success:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or service.proc.poll() is not None:
            raise RuntimeError(f"smg does not relay: see {service.log}")
        time.sleep(0.2)
    return service, "sglang-router==0.3.2"
