"""Run every benchmark once, in order, then rewrite ``docs/benchmarks.md`` from the results.

Called by ``tests/bench/run`` (the documented command). Earlier results are deleted first,
so the document only ever shows one run; ``--quick`` and ``--skip`` runs write their
report to ``tests/bench/out/benchmarks.md`` instead and leave ``docs/`` alone. Each
benchmark's output goes to the terminal and to ``tests/bench/out/<name>.log``;
``run.json`` records the command, the machine, the load average before each benchmark and
every exit status. Exit status 1 when any benchmark failed (the document still gets
written, saying which).

    .venv/bin/python -m tests.bench.runner [--quick] [--skip NAME ...]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from tests.bench import report
from tests.bench._bench import OUT, ROOT, machine, prepare

__all__ = ["BASELINE", "main"]

# The last commit whose proxy.py predates the benchmark's fixes: measured as worker@baseline.
BASELINE = "ed6b9469340bc9b48cf1a73c87a2a8323f9b2671"
_NAMES = (
    "stream",
    "placement",
    "load",
    "footprint",
    "chart",
    "fetch",
    "sie_encode",
    "router",
    "gateway",
    "lora",
    "sharing",
    "vllm",
    "hop_cost",
    "engine_calls",
    "resume",
)
# The last commit whose worker sent JSON answers through httpx: engine_calls' "before".
ENGINE_CALLS_BEFORE = "228d00ec620ad78a221accffece183d0d36247ea"


def _commands(quick: bool, *, record: bool = True) -> dict[str, list[str]]:
    """Each benchmark's command; ``record``: benchmarks that write their own section of
    docs/benchmarks.md may (only a full run stands for the published figures)."""
    python = [sys.executable, "-m"]
    stream = [*python, "tests.bench.bench_stream", "--baseline", BASELINE]
    commands = {
        "stream": [*stream, "--quick"] if quick else stream,
        "placement": [*python, "tests.bench.bench_placement"]
        + (["--steps", "3000"] if quick else [])
        + ([] if record else ["--no-record"]),
        "load": [*python, "tests.bench.bench_load"] + (["--rounds", "4"] if quick else []),
        "footprint": [*python, "tests.bench.bench_footprint"]
        + (["--requests", "300", "--streams", "30"] if quick else []),
        "chart": [*python, "tests.bench.bench_chart"] + (["--runs", "3"] if quick else []),
        "fetch": [*python, "tests.bench.bench_fetch"]
        + (["--size-mib", "512", "--rounds", "1"] if quick else []),
        "sie_encode": [*python, "tests.bench.bench_sie_encode"]
        + (["--rounds", "2", "--seconds", "1"] if quick else [])
        + ([] if record else ["--no-record"]),
        "sharing": [*python, "tests.bench.bench_sharing"]
        + (["--requests", "20000"] if quick else [])
        + ([] if record else ["--no-record"]),
        "lora": [*python, "tests.bench.bench_lora"]
        + (["--rounds", "1", "--seconds", "2"] if quick else [])
        + ([] if record else ["--no-record"]),
        "vllm": [*python, "tests.bench.bench_vllm"]
        + (["--rounds", "3"] if quick else [])
        + ([] if record else ["--no-record"]),
        "sglang": [*python, "tests.bench.bench_sglang"]
        + (["--rounds", "3"] if quick else [])
        + ([] if record else ["--no-record"]),
        # Issue 26's per-hop figures, kept in the run so that a regression shows.
        "hop_cost": [*python, "tests.bench.bench_hop_cost", "--repeats", "1"]
        + (["--tokens", "4", "50", "--duration", "2"] if quick else []),
        "engine_calls": [*python, "tests.bench.bench_engine_calls", "--before", ENGINE_CALLS_BEFORE]
        + (["--requests", "200", "--repeats", "1"] if quick else [])
        + ([] if record else ["--no-record"]),
        "resume": [*python, "tests.bench.bench_resume"]
        + (["--repeats", "2", "--duration", "1"] if quick else [])
        + ([] if record else ["--no-record"]),
    }
    # The gateway's benchmark writes its own section (## Gateway) of docs/benchmarks.md.
    gateway = [*python, "tests.bench.bench_gateway"]
    commands["gateway"] = [*gateway, "--quick"] if quick else gateway
    router = ROOT / "tests" / "bench" / "bench_router.py"
    if router.exists():  # the router engineer's benchmark; its section is theirs
        commands["router"] = [sys.executable, str(router)]
    return commands


def _run(name: str, argv: list[str]) -> dict[str, Any]:
    log = OUT / f"{name}.log"
    started = time.monotonic()
    print(f"\n=== {name}: {' '.join(argv)}", flush=True)
    with log.open("w") as sink:
        proc = subprocess.Popen(
            argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            sink.write(line)
        code = proc.wait()
    seconds = time.monotonic() - started
    print(f"=== {name}: exit {code} after {seconds:.0f} s", flush=True)
    return {"exit": code, "seconds": seconds, "argv": argv}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="smaller runs, for trying it out")
    parser.add_argument("--skip", nargs="+", default=[], choices=_NAMES)
    args = parser.parse_args(argv)
    prepare()
    OUT.mkdir(parents=True, exist_ok=True)
    for old in OUT.glob("*.json"):
        old.unlink()
    command = "tests/bench/run" + "".join(f" {a}" for a in (argv or sys.argv[1:]))
    started = time.monotonic()
    run: dict[str, Any] = {
        "command": command,
        "started": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "loadavg": [],
        "benches": {},
    }
    record = not (args.quick or args.skip)
    for name, bench_argv in _commands(args.quick, record=record).items():
        if name in args.skip:
            continue
        run["loadavg"].append(os.getloadavg()[0])
        run["benches"][name] = _run(name, bench_argv)
    run["loadavg"].append(os.getloadavg()[0])
    run["seconds"] = time.monotonic() - started
    (OUT / "run.json").write_text(json.dumps(run, indent=2) + "\n")
    if args.quick or args.skip:
        # Only a full run may stand for the published figures.
        report.main(["--output", str(OUT / "benchmarks.md")])
        print("partial run: docs/benchmarks.md left as it was")
    else:
        report.main([])
    failed = [name for name, status in run["benches"].items() if status["exit"] != 0]
    if failed:
        print(f"failed: {', '.join(failed)} (logs in tests/bench/out/)", file=sys.stderr)
    print(f"all benchmarks took {run['seconds'] / 60:.1f} min")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
