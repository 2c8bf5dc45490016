"""What the real-engine benchmarks share (bench_vllm, bench_sglang): the worker in front of a
real engine, side by side with the engine's own port, and what the worker adds to a load.

- **Load overhead**: while the worker loads a model, a poller finds the engine's process and
  asks its health path every 5 ms; the engine's own start-up is its process's start to its
  first 200, and what the worker adds is the load's answer time less that (options and
  placement before the spawn, readiness polling and registration after).
- **Throughput and TTFT**: for each number of concurrent streams, rounds of streamed
  ``/v1/completions`` (``ignore_eos``, usage asked for) go alternately to the engine's own port
  (``direct``) and the worker's (``worker``), each path on its own kept-alive client (as the
  openai client and sie-sdk keep theirs); each path's tokens/s (completion tokens of the
  round over its wall time) and TTFT (request sent -> first text) are kept per round, and the
  CPU the worker and the engine's HTTP process spent per token; the figures are the medians.
  One stream's TTFT comes from its own samples: hundreds of 2-token streams, alternating
  path by path on kept-alive clients.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from tests.bench._bench import OUT, ROOT, cpu_seconds, prepare, services, start_worker, write_result
from tests.bench.report import record_section
from tests.support import loopback, tiny_models

__all__ = ["PATHS", "EngineBench", "engine_port", "load_overhead", "main", "measure", "table"]

PATHS = ("direct", "worker")


def engine_port(module: str, model: str) -> tuple[int, psutil.Process] | None:
    """The port and main process of the engine ``python -m <module>`` serving ``model``."""
    for process in psutil.process_iter(["cmdline"]):
        argv = process.info["cmdline"] or []
        if module in argv and model in argv and "--port" in argv:
            return int(argv[argv.index("--port") + 1]), process
    return None


def _watch_start(module: str, model: str, found: dict[str, float], stop: threading.Event) -> None:
    """Poll for the engine; note its process start and its first healthy answer."""
    while not stop.is_set():
        engine = engine_port(module, model)
        if engine is None:
            time.sleep(0.01)
            continue
        port, process = engine
        found["spawned"] = process.create_time()
        with loopback.client(timeout=30.0) as client:
            while not stop.is_set():
                try:
                    if client.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                        found["ready"] = time.time()
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.005)
        return


def load_overhead(worker_url: str, module: str, model: str) -> dict[str, float]:
    """Load ``model`` through the worker; the load's time, the engine's own, and the rest."""
    found: dict[str, float] = {}
    stop = threading.Event()
    watcher = threading.Thread(target=_watch_start, args=(module, model, found, stop), daemon=True)
    watcher.start()
    asked = time.time()
    with loopback.client(base_url=worker_url, timeout=600) as client:
        client.post(f"/v1/models/{model}/load").raise_for_status()
    answered = time.time()
    stop.set()
    watcher.join(timeout=30)
    load_s, engine_s = answered - asked, found["ready"] - found["spawned"]
    return {"load_s": load_s, "engine_s": engine_s, "added_s": load_s - engine_s}


async def _stream(
    client: httpx.AsyncClient, url: str, model: str, tokens: int
) -> tuple[float, int]:
    """One streamed completion: (seconds to its first text, completion tokens)."""
    body = {
        "model": model,
        "prompt": "The quick brown fox",
        "max_tokens": tokens,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    started, first, count = time.perf_counter(), None, 0
    async with client.stream("POST", url, json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                count = int(chunk["usage"]["completion_tokens"])
            if first is None and chunk.get("choices") and chunk["choices"][0].get("text"):
                first = time.perf_counter() - started
    return (first if first is not None else float("nan")), count


async def _round(
    client: httpx.AsyncClient, base: str, model: str, streams: int, tokens: int
) -> dict[str, float]:
    url = base + "/v1/completions"
    started = time.perf_counter()
    results = await asyncio.gather(*(_stream(client, url, model, tokens) for _ in range(streams)))
    elapsed = time.perf_counter() - started
    return {
        "tokens_per_s": sum(n for _, n in results) / elapsed,
        "ttft_s": statistics.median(t for t, _ in results),
    }


async def _first_tokens(
    urls: Mapping[str, str], model: str, samples: int
) -> dict[str, list[float]]:
    """TTFT alone: ``samples`` short streams per path, alternating one by one, each path on
    its own kept-alive client. A round of 64 tokens gives one TTFT, and the engine's own TTFT
    varies by tens of ms from one to the next on these cores: a median of 41 could not tell a
    few ms apart (its standard error was about 3 ms), one of hundreds can."""
    found: dict[str, list[float]] = {path: [] for path in urls}
    async with httpx.AsyncClient(timeout=300) as direct, httpx.AsyncClient(timeout=300) as via:
        clients = {"direct": direct, "worker": via}
        for path in urls:  # open each path's connections before timing
            await _stream(clients[path], urls[path] + "/v1/completions", model, 2)
        for _ in range(samples):
            for path, base in urls.items():
                first, _ = await _stream(clients[path], base + "/v1/completions", model, 2)
                found[path].append(first)
    return found


async def _rounds(
    urls: Mapping[str, str],
    pids: tuple[int, int],
    model: str,
    streams: int,
    rounds: int,
    tokens: int,
) -> tuple[dict[str, list[dict[str, float]]], dict[str, dict[str, float]]]:
    """``rounds`` rounds per path, alternating, each path on its own kept-alive client (as
    the openai client and sie-sdk keep theirs); the CPU of the worker and of the engine's
    HTTP process (``pids``) and the tokens of each path's rounds."""
    worker_pid, api_server = pids
    tries: dict[str, list[dict[str, float]]] = {p: [] for p in PATHS}
    cpu = {p: {"worker": 0.0, "api_server": 0.0, "tokens": 0.0} for p in PATHS}
    limits = httpx.Limits(max_keepalive_connections=streams, max_connections=streams)
    async with (
        httpx.AsyncClient(timeout=300, limits=limits) as direct,
        httpx.AsyncClient(timeout=300, limits=limits) as via,
    ):
        clients = {"direct": direct, "worker": via}
        for path in PATHS:  # open each path's connections before timing
            await _round(clients[path], urls[path], model, streams, tokens)
        for _ in range(rounds):
            for path in PATHS:
                before = cpu_seconds([worker_pid]), cpu_seconds([api_server]), time.perf_counter()
                result = await _round(clients[path], urls[path], model, streams, tokens)
                cpu[path]["worker"] += cpu_seconds([worker_pid]) - before[0]
                cpu[path]["api_server"] += cpu_seconds([api_server]) - before[1]
                cpu[path]["tokens"] += result["tokens_per_s"] * (time.perf_counter() - before[2])
                tries[path].append(result)
    return tries, cpu


def measure(
    worker: tuple[str, int],
    direct_url: str,
    api_server: int,
    model: str,
    *,
    streams_list: tuple[int, ...],
    rounds: int,
    tokens: int,
    ttft_samples: int,
) -> list[dict[str, Any]]:
    """The rounds of each path; beside its figures, the CPU the worker and the engine's HTTP
    process (``api_server``) spent per token during them. One stream's TTFT is the median of
    ``ttft_samples`` short streams per path (:func:`_first_tokens`), not of the rounds'."""
    worker_url, worker_pid = worker
    urls = {"direct": direct_url, "worker": worker_url}
    first = asyncio.run(_first_tokens(urls, model, ttft_samples)) if 1 in streams_list else {}
    cells = []
    for streams in streams_list:
        tries, cpu = asyncio.run(
            _rounds(urls, (worker_pid, api_server), model, streams, rounds, tokens)
        )
        for path in PATHS:
            produced = cpu[path]["tokens"] or 1.0
            ttfts = first[path] if streams == 1 else [r["ttft_s"] for r in tries[path]]
            cells.append(
                {
                    "path": path,
                    "streams": streams,
                    "tokens_per_s": statistics.median(r["tokens_per_s"] for r in tries[path]),
                    "ttft_p50_s": statistics.median(ttfts),
                    "ttft_samples": len(ttfts),
                    "worker_us_per_token": cpu[path]["worker"] / produced * 1e6,
                    "api_server_us_per_token": cpu[path]["api_server"] / produced * 1e6,
                    "rounds": tries[path],
                }
            )
    return cells


def table(cells: list[dict[str, Any]], streams_list: tuple[int, ...], server: str) -> list[str]:
    """The side-by-side table, one row per number of streams (``server``: the engine's HTTP
    process, as its column names it)."""
    by = {(c["path"], c["streams"]): c for c in cells}
    lines = [
        "| streams | direct tok/s | worker tok/s | worker/direct | direct TTFT p50 | "
        f"worker TTFT p50 | added TTFT | {server} CPU/token | worker CPU/token |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for streams in streams_list:
        direct, worker = by[("direct", streams)], by[("worker", streams)]
        ratio = worker["tokens_per_s"] / direct["tokens_per_s"]
        added = (worker["ttft_p50_s"] - direct["ttft_p50_s"]) * 1000
        lines.append(
            f"| {streams} | {direct['tokens_per_s']:.1f} | {worker['tokens_per_s']:.1f} | "
            f"{ratio:.1%} | {direct['ttft_p50_s'] * 1000:.1f} ms | "
            f"{worker['ttft_p50_s'] * 1000:.1f} ms | {added:+.1f} ms | "
            f"{worker['api_server_us_per_token']:.0f} µs | "
            f"{worker['worker_us_per_token']:.0f} µs |"
        )
    return lines


@dataclass(frozen=True)
class EngineBench:
    """One engine's benchmark: what differs between bench_vllm and bench_sglang."""

    name: str  # "vllm": its result file (tests/bench/out/NAME.json), module and model ids
    module: str  # the engine's ``python -m`` module
    env: Mapping[str, str]  # the worker's environment
    config: Callable[[str, Path, int], dict[str, Any]]  # the model's config at a width
    python: Path  # the engine's interpreter, to read its version
    section: Callable[[dict[str, Any], str], str]  # the docs/benchmarks.md section
    streams: tuple[int, ...]
    rounds: int  # the default number of rounds


def main(bench: EngineBench, argv: Sequence[str] | None, description: str) -> int:
    """Load the model at width 2 through the worker (the load's overhead), then at width 1
    measure both paths; write the result and the section."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rounds", type=int, default=bench.rounds)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument(
        "--ttft-samples", type=int, default=301, help="short streams per path for one's TTFT"
    )
    parser.add_argument("--no-record", action="store_true", help="print, do not write the doc")
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "benchmarks.md")
    args = parser.parse_args(argv)
    prepare()
    model_dir = OUT / "tiny-llama-32"
    if not (model_dir / "config.json").is_file():
        subprocess.run(
            [sys.executable, tiny_models.__file__, str(model_dir), "--head-dim", "32"], check=True
        )
    wide, served = f"bench/tiny-{bench.name}-tp2", f"bench/tiny-{bench.name}"
    client_core = {max(os.sched_getaffinity(0))}
    os.sched_setaffinity(0, client_core)
    with services() as started:
        worker = start_worker(
            f"bench-{bench.name}-worker",
            OUT / f"{bench.name}-configs",
            env=dict(bench.env),
            models=[bench.config(wide, model_dir, 2), bench.config(served, model_dir, 1)],
            cpus=client_core,
        )
        started.append(worker)
        load = load_overhead(worker.url, bench.module, wide)
        with loopback.client(base_url=worker.url, timeout=600) as client:
            client.post(f"/v1/models/{wide}/unload").raise_for_status()
            client.post(f"/v1/models/{served}/load").raise_for_status()
        engine = engine_port(bench.module, served)
        assert engine is not None, "the engine is not running after its load"
        cells = measure(
            (worker.url, worker.proc.pid),
            f"http://127.0.0.1:{engine[0]}",
            engine[1].pid,
            served,
            streams_list=bench.streams,
            rounds=args.rounds,
            tokens=args.tokens,
            ttft_samples=args.ttft_samples,
        )
    top = bench.module.split(".", 1)[0]
    version = subprocess.run(
        [str(bench.python), "-c", f"import {top}; print({top}.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    result = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{psutil.cpu_count()} CPUs, load average {psutil.getloadavg()[0]:.1f}",
        bench.name: version,
        "tokens": args.tokens,
        "rounds": args.rounds,
        "ttft_samples": args.ttft_samples,
        "cells": cells,
        "load": load,
    }
    write_result(bench.name, result)
    command = (
        f".venv/bin/python -m tests.bench.bench_{bench.name}"
        + (f" --rounds {args.rounds}" if args.rounds != bench.rounds else "")
        + (f" --ttft-samples {args.ttft_samples}" if args.ttft_samples != 301 else "")
    )
    text = bench.section(result, command)
    print(text)
    if not args.no_record:
        record_section(args.output, text)
    return 0
