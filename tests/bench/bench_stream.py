"""Streaming proxy overhead: direct vs nginx vs worker vs router + worker, same engine.

One fake SGLang engine (started by the worker's own load, ``--fake-parser=minimal``)
serves every path, so the paths differ only by what sits in front of it:

- ``direct``: the engine's port;
- ``nginx``: Debian's nginx as an SSE reverse proxy (``proxy_buffering off``, HTTP/1.1
  upstream keep-alive, one worker process, 127.0.0.1, foreground, temp prefix);
- ``worker``: ``sie-worker serve`` (the model loaded, requests by model name);
- ``router+worker``: ``sie-worker route`` (``SIE_GPU_COUNT=1 SIE_WORKER_PORTS=<worker>``).

Pinning (when two CPUs are allowed): the proxy tier (nginx, worker, router) runs on CPU 1,
the engine and the load generator (``loadgen.py``, a separate process) on CPU 0, so "on one
core" means the proxy has CPU 1 to itself as far as this benchmark goes. Other processes
on a shared machine still compete, so the servers' CPU time per event (sampled over the
measurement window) is reported beside the wall-clock figures: it does not depend on how
much of the core the scheduler gave us.

Two engine speeds: ``fast`` (the engine writes ``--fast-tokens`` events per stream as fast
as it can) and ``rate`` (one event every 20 ms per stream, 50 tok/s, ``--rate-tokens`` per
stream), at 1, 16, 64 and 256 concurrent streams; the paths take turns within each cell,
``--repeats`` times, and each path keeps the try that other processes disturbed least.
With ``--baseline REV`` a second worker runs ``proxy.py`` as of git REV (path
``worker@baseline``, on its own engine) to show a change's effect within one run.
Afterwards py-spy samples the workers and the router (fast: 64 streams; 50 tok/s: 256).

    .venv/bin/python -m tests.bench.bench_stream [--quick] [--baseline REV] [--nginx PATH]
        [--no-profile] [--paths direct nginx worker router+worker worker@baseline]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from tests.bench._bench import (
    MODEL,
    OUT,
    ROOT,
    Service,
    cpu_seconds,
    pin,
    pinning_available,
    prepare,
    services,
    spawn,
    start_worker,
    taskset,
    wait_http,
    worker_env,
    write_result,
)
from tests.support import loopback
from tests.support.ports import free_port

__all__ = ["main"]

_LOADGEN = Path(__file__).with_name("loadgen.py")
_PROXY_CPUS = {1}
_CLIENT_CPUS = {0}
_FOCUS = (
    "AsyncConnectionPool._assign_requests_to_connections",  # httpcore's pool bookkeeping
    "RequestResponseCycle.send",  # uvicorn's per-write cost
    "StreamingResponse.stream_response",  # the whole downstream side of a stream
    "Response.aiter_raw",  # the whole upstream side through httpx: httpcore, h11
    "UpstreamAnswer.data_received",  # the whole upstream side through sie_worker.http.upstream
)
_PATHS = ("direct", "nginx", "worker", "router+worker", "worker@baseline")
_NGINX_CONF = """\
worker_processes 1;
daemon off;
pid {prefix}/nginx.pid;
error_log stderr warn;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    upstream engine {{
        server 127.0.0.1:{upstream};
        keepalive 512;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://engine;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_cache off;
            proxy_read_timeout 600s;
        }}
    }}
}}
"""


@dataclass(frozen=True)
class Mode:
    name: str
    fast: bool
    tokens: int
    token_delay_s: float = 0.02

    def loadgen_args(self) -> list[str]:
        args = ["--tokens", str(self.tokens)]
        return (
            [*args, "--fast"] if self.fast else [*args, "--token-delay-s", str(self.token_delay_s)]
        )


@dataclass
class Path_:
    name: str
    base: str  # http://127.0.0.1:PORT
    cpu_pids: list[int]  # the proxy tier's processes (none for direct)
    engine_pid: int
    command: str
    model: str = MODEL
    hops: dict[str, list[int]] = field(default_factory=dict)  # hop -> its processes

    @property
    def url(self) -> str:
        return self.base + "/v1/completions"


def _nginx_binary(explicit: str | None) -> str | None:
    candidates = [explicit, os.environ.get("BENCH_NGINX"), shutil.which("nginx"), "/usr/sbin/nginx"]
    candidates.append(str(OUT / "nginx" / "usr" / "sbin" / "nginx"))
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def _start_nginx(binary: str, upstream: int, cpus: set[int] | None) -> tuple[Service, str]:
    prefix = OUT / "nginx-run"
    shutil.rmtree(prefix, ignore_errors=True)
    for sub in ("conf", "body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (prefix / sub).mkdir(parents=True, exist_ok=True)
        (prefix / sub).chmod(0o777)  # workers run as nobody when started by root
    port = free_port()
    conf = prefix / "conf" / "nginx.conf"
    conf.write_text(_NGINX_CONF.format(prefix=prefix, upstream=upstream, port=port))
    version = subprocess.run([binary, "-v"], capture_output=True, text=True, check=False)
    argv = [binary, "-p", str(prefix), "-c", str(conf), "-e", "stderr"]
    service = spawn("nginx", argv, port=port, env=os.environ, cpus=cpus)
    wait_http(service.url + "/health", proc=service.proc)
    return service, version.stderr.strip()


def _engine_of(worker: Service) -> tuple[int, int]:
    for child in psutil.Process(worker.proc.pid).children(recursive=True):
        cmd = child.cmdline()
        if any("fake_engine.py" in part for part in cmd) and "--port" in cmd:
            return child.pid, int(cmd[cmd.index("--port") + 1])
    raise RuntimeError("the worker has no engine process after the load")


def _smoke(url: str) -> str | None:
    """None when one short stream through ``url`` works, else what went wrong."""
    body = {"model": MODEL, "prompt": "a b", "stream": True, "fake": {"fast": True, "tokens": 3}}
    try:
        with loopback.stream("POST", url, json=body, timeout=20) as response:
            text = response.read().decode(errors="replace")
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}"
    if response.status_code != 200 or "data: [DONE]" not in text:
        return f"HTTP {response.status_code}: {text[:300]}"
    return None


def _start_router(worker: Service, cpus: set[int] | None) -> Service:
    port = free_port()
    env = worker_env({"SIE_GPU_COUNT": "1", "SIE_WORKER_PORTS": str(worker.port)})
    argv = [sys.executable, "-m", "sie_worker", "route", "--host", "127.0.0.1", "--port", str(port)]
    service = spawn("router", argv, port=port, env=env, cpus=cpus)
    wait_http(service.url + "/healthz", proc=service.proc)
    deadline = time.monotonic() + 30
    while _smoke(service.url + "/v1/completions") is not None:
        if time.monotonic() > deadline or service.proc.poll() is not None:
            break
        time.sleep(0.2)
    return service


def _cell(path: Path_, mode: Mode, streams: int, args: argparse.Namespace) -> dict[str, Any]:
    argv = [
        *taskset(_CLIENT_CPUS if args.pinned else None),
        sys.executable,
        str(_LOADGEN),
        "--url",
        path.url,
        "--model",
        path.model,
        "--concurrency",
        str(streams),
        "--duration",
        str(args.duration),
        "--warmup",
        str(args.warmup),
        *mode.loadgen_args(),
    ]
    cpu: dict[str, float] = {}
    cores0: list[Any] = []
    cores1: list[Any] = []
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stdout is not None
    result: dict[str, Any] = {}
    for line in proc.stdout:
        if line.startswith("# window start"):
            cpu["proxy0"] = cpu_seconds(path.cpu_pids)
            cpu["engine0"] = cpu_seconds([path.engine_pid])
            for hop, pids in path.hops.items():
                cpu[f"{hop}0"] = cpu_seconds(pids)
            cores0 = psutil.cpu_times(percpu=True)
        elif line.startswith("# window end"):
            cpu["proxy1"] = cpu_seconds(path.cpu_pids)
            cpu["engine1"] = cpu_seconds([path.engine_pid])
            for hop, pids in path.hops.items():
                cpu[f"{hop}1"] = cpu_seconds(pids)
            cores1 = psutil.cpu_times(percpu=True)
        elif line.startswith("{"):
            result = json.loads(line)
    if proc.wait(timeout=60) != 0 or not result:
        raise RuntimeError(f"loadgen failed on {path.name}: exit {proc.returncode}")
    busy = [_busy(a, b) for a, b in zip(cores0, cores1, strict=True)]
    proxy_cpu = cpu["proxy1"] - cpu["proxy0"]
    engine_cpu = cpu["engine1"] - cpu["engine0"]
    events = max(result["events"], 1)
    result.update(
        {
            "path": path.name,
            "mode": mode.name,
            "proxy_cpu_share": proxy_cpu / args.duration if path.cpu_pids else None,
            "proxy_cpu_us_per_event": proxy_cpu / events * 1e6 if path.cpu_pids else None,
            "engine_cpu_share": engine_cpu / args.duration,
            "core_busy": busy,  # each CPU's busy share in the window, everyone's work included
            "engine_cpu_us_per_event": engine_cpu / events * 1e6,
            # Each hop's own CPU per relayed event, in the same window.
            "hop_cpu_us_per_event": {
                hop: (cpu[f"{hop}1"] - cpu[f"{hop}0"]) / events * 1e6 for hop in path.hops
            },
        }
    )
    return result


def _least_disturbed(tries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Of a cell's runs, the one in which other processes used the least CPU.

    "Other" is both CPUs' busy time minus what the proxy, the engine and the load generator
    used, so the choice does not look at the outcome being measured.
    """
    for cell in tries:
        ours = (cell["proxy_cpu_share"] or 0.0) + cell["engine_cpu_share"]
        ours += cell["client_cpu_share"]
        cell["others_cpu_share"] = max(0.0, sum(cell["core_busy"]) - ours)
    best = min(tries, key=lambda cell: cell["others_cpu_share"])
    best["others_by_try"] = [round(cell["others_cpu_share"], 3) for cell in tries]
    return best


def _busy(before: Any, after: Any) -> float:
    """Busy share of one CPU between two ``psutil.cpu_times(percpu=True)`` samples."""
    idle = (after.idle + after.iowait) - (before.idle + before.iowait)
    total = sum(after) - sum(before)
    return 1.0 - idle / total if total > 0 else 0.0


def _profile(
    target: Service, path: Path_, mode: Mode, streams: int, args: argparse.Namespace
) -> dict[str, Any]:
    """py-spy the ``target`` process while ``streams`` streams run through ``path``."""
    raw = OUT / f"profile-{path.name}-{'fast' if mode.fast else 'rate'}.txt"
    seconds = max(int(args.duration), 3)
    spy = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("py-spy")),
            "record",
            "--pid",
            str(target.proc.pid),
            "--duration",
            str(seconds),
            "--rate",
            "200",
            "--nonblocking",
            "--nolineno",
            "--format",
            "raw",
            "--output",
            str(raw),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(0.5)
    profile_args = argparse.Namespace(**{**vars(args), "duration": seconds + 1, "warmup": 0.5})
    load = _cell(path, mode, streams, profile_args)
    _, err = spy.communicate(timeout=60)
    if spy.returncode != 0 or not raw.exists():
        return {"error": f"py-spy failed ({spy.returncode}): {err.strip()[-500:]}"}
    return {
        "file": str(raw.relative_to(ROOT)),
        "streams": streams,
        "load": load,
        **summarize_profile(raw.read_text()),
    }


def _package(frame: str) -> str:
    """``func (path/to/file.py)`` -> the package or module the frame's code belongs to."""
    where = frame[frame.rfind("(") + 1 : -1] if frame.endswith(")") else frame
    parts = where.replace("\\", "/").split("/")
    for anchor in ("site-packages", "sie_worker", "lib"):
        if anchor in parts:
            rest = parts[parts.index(anchor) + 1 :]
            if anchor == "sie_worker":
                return "sie_worker/" + "/".join(rest)
            if anchor == "lib" and rest and rest[0].startswith("python"):
                rest = rest[1:]
                return "stdlib " + (rest[0] if rest else where)
            return rest[0] if rest else where
    return where


def summarize_profile(text: str, top: int = 12) -> dict[str, Any]:
    """Self and inclusive sample shares from py-spy's raw (collapsed stack) output."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    packages: collections.Counter[str] = collections.Counter()
    total = 0
    for line in text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [f for f in stack.split(";") if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        total += count
        own[frames[-1]] += count
        packages[_package(frames[-1])] += count
        for frame in set(frames):
            inclusive[frame] += count

    def shares(counter: collections.Counter[str], n: int) -> list[dict[str, Any]]:
        return [{"frame": k, "share": v / max(total, 1)} for k, v in counter.most_common(n)]

    focus = {
        name: sum(v for k, v in inclusive.items() if k.startswith(name + " ")) / max(total, 1)
        for name in _FOCUS
    }
    return {
        "samples": total,
        "self": shares(own, top),
        "inclusive": shares(inclusive, top + 8),
        "packages": shares(packages, top),
        "focus": focus,  # inclusive share of the frames the report discusses
    }


def _cells(args: argparse.Namespace) -> Iterator[tuple[Mode, int]]:
    modes = (
        Mode("fast", fast=True, tokens=args.fast_tokens),
        Mode("50 tok/s", fast=False, tokens=args.rate_tokens, token_delay_s=0.02),
    )
    for mode in modes:
        for streams in args.concurrency:
            yield mode, streams


def _overlay(rev: str) -> Path:
    """A copy of the worker package whose ``proxy.py`` is the one at git ``rev``."""
    text = subprocess.run(
        ["git", "show", f"{rev}:worker/src/sie_worker/proxy.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    root = OUT / "baseline"
    shutil.rmtree(root, ignore_errors=True)
    package = root / "sie_worker"
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "worker" / "src" / "sie_worker", package, ignore=ignore)
    shutil.copytree(ROOT / "schemas", package / "schemas")  # as in the wheel
    (package / "proxy.py").write_text(text)
    return root


def _with_engine(worker: Service, pinned: bool) -> int:
    """Load the model on ``worker``; pin its engine next to the client; return its pid."""
    loopback.post(f"{worker.url}/v1/models/{MODEL}/load", timeout=120).raise_for_status()
    engine_pid, _ = _engine_of(worker)
    if pinned:
        pin(engine_pid, _CLIENT_CPUS)
    return engine_pid


def _start_paths(
    args: argparse.Namespace, running: list[Service]
) -> tuple[dict[str, Path_], dict[str, Service], dict[str, str], str | None]:
    """Start what every selected path needs; paths that fail their smoke test are dropped."""
    cpus = _PROXY_CPUS if args.pinned else None
    unavailable: dict[str, str] = {}
    targets: dict[str, Service] = {}
    nginx_version = None
    worker = start_worker("stream-worker", OUT / "stream-configs", cpus=cpus)
    running.append(worker)
    engine_pid = _with_engine(worker, args.pinned)
    engine_port = _engine_of(worker)[1]
    engine_url = f"http://127.0.0.1:{engine_port}"
    paths = {
        "direct": Path_("direct", engine_url, [], engine_pid, "the engine's port"),
        "worker": Path_("worker", worker.url, [worker.proc.pid], engine_pid, "sie-worker serve"),
    }
    targets["worker"] = worker
    if "nginx" in args.paths:
        binary = _nginx_binary(args.nginx)
        if binary is None:
            unavailable["nginx"] = "no nginx binary (tests/bench/run fetches Debian's nginx)"
        else:
            nginx, nginx_version = _start_nginx(binary, engine_port, cpus)
            running.append(nginx)
            paths["nginx"] = Path_(
                "nginx", nginx.url, nginx.pids(children=True), engine_pid, f"{binary}"
            )
    if "router+worker" in args.paths:
        router = _start_router(worker, cpus)
        running.append(router)
        targets["router+worker"] = router
        paths["router+worker"] = Path_(
            "router+worker",
            router.url,
            [router.proc.pid, worker.proc.pid],
            engine_pid,
            "sie-worker route -> sie-worker serve",
        )
    if args.baseline and "worker@baseline" in args.paths:
        try:
            before = start_worker(
                "stream-worker-baseline",
                OUT / "stream-configs",
                cpus=cpus,
                env={"PYTHONPATH": str(_overlay(args.baseline))},
            )
        except (OSError, RuntimeError, TimeoutError, subprocess.CalledProcessError) as exc:
            unavailable["worker@baseline"] = f"could not start it: {exc}"
        else:
            running.append(before)
            targets["worker@baseline"] = before
            paths["worker@baseline"] = Path_(
                "worker@baseline",
                before.url,
                [before.proc.pid],
                _with_engine(before, args.pinned),
                f"sie-worker serve with proxy.py at {args.baseline} (its own engine)",
            )
    for name in list(paths):
        problem = _smoke(paths[name].url) if name in args.paths else "not selected"
        if problem is not None:
            unavailable[name] = problem
            del paths[name]
            targets.pop(name, None)
    return paths, targets, unavailable, nginx_version


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--duration", type=float, default=3.0, help="measured seconds per cell")
    parser.add_argument(
        "--repeats",
        type=int,
        default=2,
        help="runs of each cell; the one other processes disturbed least is kept",
    )
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds per cell")
    parser.add_argument("--fast-tokens", type=int, default=2000)
    parser.add_argument("--rate-tokens", type=int, default=50)
    parser.add_argument("--nginx", default=None, help="nginx binary (default: PATH, out/nginx)")
    parser.add_argument(
        "--baseline",
        default=None,
        metavar="REV",
        help="also measure a worker running proxy.py as of git REV (path worker@baseline)",
    )
    parser.add_argument("--no-profile", dest="profile", action="store_false")
    parser.add_argument("--quick", action="store_true", help="1 and 64 streams, 2 s cells")
    parser.add_argument("--paths", nargs="+", default=list(_PATHS), choices=_PATHS)
    args = parser.parse_args(argv)
    prepare()
    if args.quick:
        args.concurrency, args.duration, args.repeats = [1, 64], 2.0, 1
    args.pinned = pinning_available()
    cells: list[dict[str, Any]] = []
    profiles: dict[str, Any] = {}
    with services() as running:
        paths, targets, unavailable, nginx_version = _start_paths(args, running)
        order = [p for p in _PATHS if p in paths]
        for mode, streams in _cells(args):
            tries: dict[str, list[dict[str, Any]]] = {name: [] for name in order}
            for _ in range(args.repeats):
                for name in order:
                    tries[name].append(_cell(paths[name], mode, streams, args))
            for name in order:
                cell = _least_disturbed(tries[name])
                cells.append(cell)
                print(_line(cell), flush=True)
        if args.profile:
            # Fast: 64 streams; 50 tok/s: 256 streams, where per-stream costs dominate.
            for mode, _ in _cells(argparse.Namespace(**{**vars(args), "concurrency": [0]})):
                streams = 64 if mode.fast else 256
                for name, service in targets.items():
                    key = f"{name} {mode.name}"
                    profiles[key] = _profile(service, paths[name], mode, streams, args)
                    print(f"profiled {key}: {profiles[key].get('samples')} samples", flush=True)
    result = {
        "command": "python -m tests.bench.bench_stream " + " ".join(argv or sys.argv[1:]),
        "pinned": args.pinned,
        "cpus": {"proxy": sorted(_PROXY_CPUS), "engine_and_client": sorted(_CLIENT_CPUS)}
        if args.pinned
        else None,
        "duration_s": args.duration,
        "repeats": args.repeats,
        "warmup_s": args.warmup,
        "fast_tokens": args.fast_tokens,
        "rate_tokens": args.rate_tokens,
        "baseline": args.baseline,
        "nginx": nginx_version,
        "paths": {name: p.command for name, p in paths.items()},
        "unavailable": unavailable,
        "cells": cells,
        "profiles": profiles,
    }
    write_result("stream", result)
    for name, why in unavailable.items():
        print(f"{name}: not measured: {why}")
    return 0


def _line(cell: Mapping[str, Any]) -> str:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value * 1000:.2f}"

    cpu = cell["proxy_cpu_us_per_event"]
    return (
        f"{cell['mode']:>8} {cell['concurrency']:>3} {cell['path']:>13}: "
        f"{cell['events_per_s']:>9.0f} ev/s  ttft p50 {ms(cell['ttft_p50_s'])} "
        f"p99 {ms(cell['ttft_p99_s'])} ms  itl p50 {ms(cell['itl_p50_s'])} "
        f"p99 {ms(cell['itl_p99_s'])} ms  proxy {'-' if cpu is None else f'{cpu:.1f}'} us/ev "
        f"client cpu {cell['client_cpu_share']:.2f} errors {cell['errors']}"
    )


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
