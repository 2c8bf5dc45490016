"""What a hop spends per request and per event, apart (issue 26's per-hop figure, taken apart).

The gateway benchmark divides each hop's CPU time by the events it relayed; with 50-token
streams a hop's per-request work (accepting the client's connection, parsing the head,
routing, the upstream exchange's set-up, the lease and the metrics) is spread over only 52
events, so that figure mixes the two. Here the same three hops (``sie-worker gateway`` ->
``route`` -> ``serve`` -> one fake engine, pinned as in ``bench_gateway``) carry streams of
several lengths at 50 tok/s, and each hop's CPU time in the window is fitted, by least
squares, as ``per_request x requests + per_event x events``. nginx, and SGLang's Rust router
(``sglang-router==0.3.2``, "smg": ``launch_router --worker-urls <engine> --policy
round_robin --disable-health-check``, pinned in ``requirements/bench-smg.txt``, installed into
``tests/bench/out/smg-venv`` on first use), relay the same engine's streams in their own cells
for the same fit, each in one hop's place.

Before any stream, each hop's CPU is also read over ``--idle`` seconds with no traffic: what
its own polls cost it (the router polls its workers, the gateway its router every 0.5 s here,
as in ``bench_gateway``; each answers the polls of the hop above it).

    .venv/bin/python -m tests.bench.bench_hop_cost [--tokens 4 50 400] [--streams 64]
        [--duration 3] [--repeats 2] [--idle 10] [--no-smg]

Writes ``tests/bench/out/hop_cost.json`` and prints one table; docs/benchmarks.md quotes it
by hand ("Data path").
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any

from tests.bench import bench_gateway as bg
from tests.bench import bench_stream as bs
from tests.bench._bench import (
    MODEL,
    OUT,
    ROOT,
    Service,
    cpu_seconds,
    pinning_available,
    prepare,
    services,
    start_worker,
    write_result,
)
from tests.bench._smg import smg_python, start_smg
from tests.support.worker_fixtures import fake_model

__all__ = ["fit", "idle_ms_per_s", "main"]

_HOPS = ("gateway", "router", "worker")


def fit(rows: Sequence[tuple[float, float, float]]) -> tuple[float, float]:
    """Least squares of ``cpu = a * requests + b * events`` over ``(requests, events, cpu)``
    rows: ``(a, b)``, both in the unit of ``cpu`` per unit."""
    srr = sum(r * r for r, _, _ in rows)
    see = sum(e * e for _, e, _ in rows)
    sre = sum(r * e for r, e, _ in rows)
    src = sum(r * c for r, _, c in rows)
    sec = sum(e * c for _, e, c in rows)
    det = srr * see - sre * sre
    if det == 0:
        raise ValueError("the cells must differ in events per request to tell the two apart")
    return (src * see - sec * sre) / det, (srr * sec - sre * src) / det


def idle_ms_per_s(before: float, after: float, seconds: float) -> float:
    """CPU milliseconds per second of wall time between two ``cpu_seconds`` readings."""
    if seconds <= 0:
        raise ValueError("the idle window must last longer than 0 s")
    return (after - before) * 1000 / seconds


def _idle(pids: dict[str, int], seconds: float) -> dict[str, float]:
    """Each hop's CPU per second of wall time while nothing but the polls runs."""
    before = {hop: cpu_seconds([pid]) for hop, pid in pids.items()}
    start = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - start
    return {
        hop: idle_ms_per_s(before[hop], cpu_seconds([pid]), elapsed) for hop, pid in pids.items()
    }


def _cells(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, float]]:
    pinned = pinning_available()
    proxy, client = ({1}, {0}) if pinned else (None, None)
    ns = argparse.Namespace(pinned=pinned, duration=args.duration, warmup=1.0)
    cells: list[dict[str, Any]] = []
    with services() as running:
        worker = start_worker(
            "hop-cost-worker", OUT / "hop-cost-configs", cpus=proxy, models=[fake_model(MODEL)]
        )
        running.append(worker)
        engine_pid = bs._with_engine(worker, pinned)
        engine_port = bs._engine_of(worker)[1]
        router = bs._start_router(worker, proxy)
        running.append(router)
        gateway = bg._start_gateway(router, client)
        running.append(gateway)
        pids = {"gateway": gateway.proc.pid, "router": router.proc.pid, "worker": worker.proc.pid}
        idle = _idle(pids, args.idle) if args.idle > 0 and not args.profile else {}
        paths = {
            "gateway+router+worker": bs.Path_(
                "gateway+router+worker", gateway.url, list(pids.values()), engine_pid, "",
                hops={hop: [pid] for hop, pid in pids.items()},
            ),
        }  # fmt: skip
        binary = bs._nginx_binary(None)
        if binary is not None:
            nginx: Service
            nginx, _ = bs._start_nginx(binary, engine_port, proxy)
            running.append(nginx)
            nginx_pids = nginx.pids(children=True)
            paths["nginx"] = bs.Path_(
                "nginx", nginx.url, nginx_pids, engine_pid, binary, hops={"nginx": nginx_pids}
            )
        python = smg_python() if args.smg else None
        if python is not None:
            smg, _ = start_smg(python, engine_port, proxy)
            running.append(smg)
            smg_pids = smg.pids(children=True)
            paths["smg"] = bs.Path_(
                "smg", smg.url, smg_pids, engine_pid, "sglang-router 0.3.2", hops={"smg": smg_pids}
            )
        if args.profile:
            # py-spy each hop while short streams make the per-request work most of it.
            tokens = min(args.tokens)
            mode = bs.Mode(f"50 tok/s, {tokens} tokens", False, tokens)
            for hop, service in (("gateway", gateway), ("router", router), ("worker", worker)):
                profile = bs._profile(
                    service, paths["gateway+router+worker"], mode, args.streams, ns
                )
                kept = OUT / f"profile-hop-cost-{hop}.txt"
                (ROOT / profile["file"]).replace(kept)
                print(hop, kept, profile.get("samples"), flush=True)
            return cells, idle
        for tokens in args.tokens:
            mode = bs.Mode(f"50 tok/s, {tokens} tokens", False, tokens)
            # Short streams at full concurrency would be a connection storm (64 streams of
            # 4 tokens: 800 requests/s), so they get fewer: at most 4 per token.
            streams = min(args.streams, 4 * tokens)
            for name, path in paths.items():
                tries = [bs._cell(path, mode, streams, ns) for _ in range(args.repeats)]
                cell = bs._least_disturbed(tries)
                cell.update(tokens=tokens, streams=streams)
                cells.append(cell)
                print(name, tokens, streams, cell["hop_cpu_us_per_event"], flush=True)
    return cells, idle


def _requests(cell: dict[str, Any]) -> float:
    """Requests relayed in the window: its events over the events of one stream."""
    events: int = cell["events"]
    return events / bg.events_per_stream(cell["tokens"])


def _table(cells: Sequence[dict[str, Any]]) -> list[str]:
    tokens = sorted({cell["tokens"] for cell in cells})
    lines = [
        "| hop | per request (µs) | per event (µs) | µs/event measured at "
        + " / ".join(map(str, tokens))
        + " tokens |",
        "|---|---:|---:|---|",
    ]
    for hop in (*_HOPS, "smg", "nginx"):
        rows = []
        measured = []
        for cell in sorted(cells, key=lambda c: c["tokens"]):
            per_event = cell["hop_cpu_us_per_event"].get(hop)
            if per_event is None:
                continue
            events = float(cell["events"])
            rows.append((_requests(cell), events, per_event * events))
            measured.append(f"{per_event:.1f}")
        if len(rows) < 2:
            continue
        per_request, per_event_fit = fit(rows)
        lines.append(
            f"| {hop} | {per_request:.0f} | {per_event_fit:.1f} | {' / '.join(measured)} |"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--tokens", type=int, nargs="+", default=[4, 50, 400])
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--idle",
        type=float,
        default=10.0,
        help="seconds of no traffic to read each hop's CPU (0: skip)",
    )
    parser.add_argument(
        "--no-smg",
        dest="smg",
        action="store_false",
        help="leave out the smg cell (sglang-router 0.3.2, requirements/bench-smg.txt)",
    )
    parser.add_argument(
        "--profile", action="store_true", help="py-spy each hop on the shortest streams instead"
    )
    args = parser.parse_args(argv)
    prepare()
    cells, idle = _cells(args)
    if args.profile:
        return 0
    write_result("hop_cost", {"cells": cells, "idle_cpu_ms_per_s": idle, "args": vars(args)})
    print("\n".join(_table(cells)))
    if idle:
        print(
            "\nidle CPU (polls only), ms per s: "
            + ", ".join(f"{hop} {ms:.1f}" for hop, ms in idle.items())
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
