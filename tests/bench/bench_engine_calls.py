"""The worker's engine calls on one client, against the code they replaced (issue 41).

JSON answers (completions, embeddings) used to go from the worker to its engine through
httpx's default pool (httpcore, h11, anyio), streams through the relays' own client
(``sie_worker.http.upstream``); now both take the latter, on the engine's kept-alive
connections. This benchmark runs the same worker on two source trees in one run, side by
side: ``after`` (this checkout) and ``before`` (``--before REV``, checked out once as a git
worktree under ``~/.cache/sie-workers/bench-trees/``, run through ``PYTHONPATH``). Each serves one
generation model and one embedding model on the fake engine; the worker is pinned to CPU 1,
the engines and this load generator to CPU 0, and the worker's own CPU time is read around
each cell:

- ``completion``: a non-streamed completion (a ~0.4 kB answer), per request;
- ``embedding``: 16 inputs of 384 dimensions (a ~140 kB answer), per request;
- ``stream``: a 50-token stream (52 events), per request and per event.

Trees alternate cell by cell (``--repeats`` rounds), so both see the same machine.

    .venv/bin/python -m tests.bench.bench_engine_calls [--before REV] [--requests 600]
        [--concurrency 1 16] [--repeats 2]

Writes ``tests/bench/out/engine_calls.json`` and its own section of docs/benchmarks.md
("Engine calls: one client"; not with ``--no-record``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import psutil

from tests.bench._bench import (
    OUT,
    ROOT,
    Service,
    cpu_seconds,
    pin,
    pinning_available,
    prepare,
    services,
    start_worker,
    write_result,
)
from tests.bench.report import record_section
from tests.support import loopback
from tests.support.worker_fixtures import fake_model

__all__ = ["main"]

GEN, EMB = "org/gen", "org/emb"
_CELLS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "completion": (GEN, "/v1/completions", {"prompt": "a b c d", "max_tokens": 16}),
    "embedding": (EMB, "/v1/embeddings", {"input": [f"text {i}" for i in range(16)]}),
    "stream": (
        GEN,
        "/v1/completions",
        {"prompt": "a b c d", "max_tokens": 50, "stream": True, "fake": {"fast": True}},
    ),
}
_MODELS = [
    fake_model(GEN),
    fake_model(EMB, task="encode", env={"FAKE_ENGINE_EMBEDDING_DIM": "384"}),
]


def _tree(rev: str) -> Path:
    """A worktree of ``rev`` in the user's cache, outside the repository (whose tests and
    linters would read it); made once, kept for the next run."""
    sha = subprocess.run(
        ["git", "rev-parse", "--short", rev], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    tree = cache / "sie-workers" / "bench-trees" / f"before-{sha}"
    if not (tree / "worker" / "src" / "sie_worker").is_dir():
        subprocess.run(["git", "worktree", "prune"], cwd=ROOT, check=True)
        subprocess.run(
            ["git", "worktree", "add", "--force", "--detach", str(tree), sha],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
    return tree


def _start(name: str, source: Path | None, cpus: set[int] | None) -> Service:
    env = {"SIE_DEVICES": "cuda:0,cuda:1"}
    if source is not None:
        env["PYTHONPATH"] = str(source / "worker" / "src")
    service = start_worker(name, OUT / f"{name}-configs", cpus=cpus, env=env, models=_MODELS)
    with loopback.client(base_url=service.url, timeout=60) as client:
        for model in (GEN, EMB):
            load = client.post(f"/v1/models/{model}/load")
            assert load.status_code == 200, load.text
    if cpus is not None:  # the engines (the worker's children) and this process on CPU 0
        for child in psutil.Process(service.proc.pid).children(recursive=True):
            pin(child.pid, {0})
    return service


async def _load(url: str, cell: str, requests: int, concurrency: int) -> tuple[int, float]:
    """Send ``requests`` of ``cell``, ``concurrency`` at a time: events seen, seconds."""
    model, path, body = _CELLS[cell]
    payload = {"model": model, **body}
    events = 0
    left = requests
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(
        base_url=url, timeout=60, limits=limits, trust_env=False, verify=False
    ) as c:

        async def one() -> None:
            nonlocal events, left
            while left > 0:
                left -= 1
                if body.get("stream"):
                    async with c.stream("POST", path, json=payload) as r:
                        assert r.status_code == 200, await r.aread()
                        async for line in r.aiter_lines():
                            events += line.startswith("data: ")
                else:
                    r = await c.post(path, json=payload)
                    assert r.status_code == 200, r.text

        started = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(concurrency)))
    return events, time.perf_counter() - started


def _measure(service: Service, cell: str, requests: int, concurrency: int) -> dict[str, float]:
    asyncio.run(_load(service.url, cell, max(20, requests // 10), concurrency))  # warm
    before = cpu_seconds([service.proc.pid])
    events, seconds = asyncio.run(_load(service.url, cell, requests, concurrency))
    cpu = cpu_seconds([service.proc.pid]) - before
    row = {"requests": requests, "seconds": seconds, "cpu_s": cpu}
    row["us_per_request"] = cpu / requests * 1e6
    if events:
        row["events"] = events
        row["us_per_event"] = cpu / events * 1e6
    return row


def _table(rows: Sequence[dict[str, Any]]) -> list[str]:
    lines = [
        "| cell | concurrency | code | worker CPU per request (µs) | per event (µs) | requests/s |",
        "|---|---:|---|---:|---:|---:|",
    ]
    keys = sorted({(r["cell"], r["concurrency"], r["code"]) for r in rows}, key=str)
    for cell, concurrency, code in keys:
        mine = [
            r for r in rows if (r["cell"], r["concurrency"], r["code"]) == (cell, concurrency, code)
        ]
        per_request = " / ".join(f"{r['us_per_request']:.0f}" for r in mine)
        per_event = " / ".join(f"{r['us_per_event']:.1f}" for r in mine if "us_per_event" in r)
        rate = statistics.median(r["requests"] / r["seconds"] for r in mine)
        lines.append(
            f"| {cell} | {concurrency} | {code} | {per_request} | {per_event or '-'} | {rate:.0f} |"
        )
    return lines


def _ratios(rows: Sequence[dict[str, Any]]) -> list[str]:
    """after / before of the medians, per cell and concurrency."""
    lines = []
    for cell in _CELLS:
        for concurrency in sorted({r["concurrency"] for r in rows}):

            def median(code: str, key: str, c: int = concurrency, name: str = cell) -> float:
                values = [
                    r[key]
                    for r in rows
                    if (r["cell"], r["concurrency"], r["code"]) == (name, c, code) and key in r
                ]
                return statistics.median(values) if values else float("nan")

            ratio = median("after", "us_per_request") / median("before", "us_per_request")
            if ratio == ratio:  # measured on both trees
                lines.append(f"{cell} at {concurrency}: {ratio:.2f}x")
    return lines


def section(result: dict[str, Any], command: str) -> str:
    rows = result["rows"]
    text = [
        "## Engine calls: one client",
        "",
        "The worker's calls to its engine all go through `sie_worker.http.upstream` now: JSON",
        "answers (completions, embeddings) as well as streams, on the engine's kept-alive",
        "connections, with one deadline timer per answer. `before` is the worker at "
        f"`{result['before'] or '-'}`, where JSON answers went through httpx's default pool and",
        "`asyncio.timeout_at`; both trees run side by side, alternating cell by cell (worker",
        "pinned to CPU 1, engines and load generator to CPU 0). Figures are the worker's own",
        "CPU time, one per round.",
        "",
        f"`{command}`, {result['when']}, {result['machine']}:",
        "",
        *_table(rows),
        "",
    ]
    ratios = _ratios(rows)
    if ratios:
        text += [f"Worker CPU per request, after / before (medians): {'; '.join(ratios)}.", ""]
    return "\n".join(text)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", help="the git revision to compare with (default: none)")
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--cells", nargs="+", choices=sorted(_CELLS), default=list(_CELLS))
    parser.add_argument("--no-record", action="store_true", help="print, do not write the doc")
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "benchmarks.md")
    args = parser.parse_args(argv)
    prepare()
    cpus = {1} if pinning_available() else None
    if cpus is not None:
        pin(os.getpid(), {0})
    trees: dict[str, Path | None] = {"after": None}
    if args.before:
        trees["before"] = _tree(args.before)
    rows: list[dict[str, Any]] = []
    with services() as started:
        workers = {}
        for code, source in trees.items():
            workers[code] = _start(f"engine-calls-{code}", source, cpus)
            started.append(workers[code])
        for repeat in range(args.repeats):
            for cell in args.cells:
                for concurrency in args.concurrency:
                    order = list(trees) if repeat % 2 == 0 else list(reversed(trees))
                    for code in order:
                        row = _measure(workers[code], cell, args.requests, concurrency)
                        rows.append({"cell": cell, "concurrency": concurrency, "code": code, **row})
                        print(rows[-1], file=sys.stderr, flush=True)
    result = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{psutil.cpu_count()} CPUs, load average {psutil.getloadavg()[0]:.1f}",
        "before": args.before,
        "rows": rows,
    }
    write_result("engine_calls", result)
    command = ".venv/bin/python -m tests.bench.bench_engine_calls" + "".join(
        f" {a}" for a in (argv if argv is not None else sys.argv[1:]) if a != "--no-record"
    )
    text = section(result, command)
    print(text)
    if not args.no_record:
        record_section(args.output, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
