"""What the real-engine benchmarks share (bench_vllm, bench_sglang): the worker in front of a
real engine, side by side with the engine's own port, and what the worker adds to a load.

- **Load overhead**: while the worker loads a model, a poller finds the engine's process and
  asks its health path every 5 ms; the engine's own start-up is its process's start to its
  first 200, and what the worker adds is the load's answer time less that (options and
  placement before the spawn, readiness polling and registration after).
- **Throughput and TTFT**: for each number of concurrent streams, rounds of streamed
  ``/v1/completions`` (``ignore_eos``, usage asked for) go alternately to the engine's own port
  (``direct``) and the worker's (``worker``); each path's tokens/s (completion tokens of the
  round over its wall time) and TTFT (request sent -> first text) are kept per round, and the
  CPU the worker and the engine's HTTP process spent per token; the figures are the medians.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import threading
import time
from typing import Any

import httpx
import psutil

from tests.bench._bench import cpu_seconds
from tests.support import loopback

__all__ = ["PATHS", "engine_port", "load_overhead", "measure", "table"]

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


async def _round(base: str, model: str, streams: int, tokens: int) -> dict[str, float]:
    url = base + "/v1/completions"
    async with httpx.AsyncClient(timeout=300) as client:
        started = time.perf_counter()
        results = await asyncio.gather(
            *(_stream(client, url, model, tokens) for _ in range(streams))
        )
        elapsed = time.perf_counter() - started
    return {
        "tokens_per_s": sum(n for _, n in results) / elapsed,
        "ttft_s": statistics.median(t for t, _ in results),
    }


def measure(
    worker: tuple[str, int],
    direct_url: str,
    api_server: int,
    model: str,
    *,
    streams_list: tuple[int, ...],
    rounds: int,
    tokens: int,
) -> list[dict[str, Any]]:
    """The rounds of each path; beside its figures, the CPU the worker and the engine's HTTP
    process (``api_server``) spent per token during them."""
    worker_url, worker_pid = worker
    cells = []
    for streams in streams_list:
        asyncio.run(_round(direct_url, model, streams, tokens))  # warm both paths' connections
        asyncio.run(_round(worker_url, model, streams, tokens))
        tries: dict[str, list[dict[str, float]]] = {p: [] for p in PATHS}
        cpu = {p: {"worker": 0.0, "api_server": 0.0, "tokens": 0.0} for p in PATHS}
        for _ in range(rounds):
            for path, base in (("direct", direct_url), ("worker", worker_url)):
                before = cpu_seconds([worker_pid]), cpu_seconds([api_server]), time.perf_counter()
                result = asyncio.run(_round(base, model, streams, tokens))
                cpu[path]["worker"] += cpu_seconds([worker_pid]) - before[0]
                cpu[path]["api_server"] += cpu_seconds([api_server]) - before[1]
                cpu[path]["tokens"] += result["tokens_per_s"] * (time.perf_counter() - before[2])
                tries[path].append(result)
        for path in PATHS:
            produced = cpu[path]["tokens"] or 1.0
            cells.append(
                {
                    "path": path,
                    "streams": streams,
                    "tokens_per_s": statistics.median(r["tokens_per_s"] for r in tries[path]),
                    "ttft_p50_s": statistics.median(r["ttft_s"] for r in tries[path]),
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
