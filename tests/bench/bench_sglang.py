"""The worker in front of a real SGLang engine on cpu devices: tokens/s and time to first
token through the worker against the engine's own port, side by side, and what the worker
adds to a load (the method: :mod:`tests.bench._engine_bench`).

One worker (``SIE_BUNDLE=sglang-cu130``, ``SIE_DEVICES=cpu:0,cpu:1``) serves the tiny Llama of
``tests/support/tiny_models.py`` in float32 with SGLang 0.5.23 (``.venv-sglang``, with the
tests' stand-in for its CPU kernel module).

**Load overhead**: the model as a real TP=2 engine (two scheduler ranks, one per core).

**Throughput and TTFT**: the same model at width 1 on ``cpu:0``: the engine (its launcher,
scheduler and detokenizer, all on the block's core 0, as the worker places them) against the
worker and this client on core 1, for 1 and 8 concurrent streams.

Writes ``tests/bench/out/sglang.json`` and the ``## SGLang behind the worker`` section of
``docs/benchmarks.md`` (unless ``--no-record``).

    .venv/bin/python -m tests.bench.bench_sglang [--rounds 7] [--tokens 64] [--no-record]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

from tests.bench._bench import OUT, ROOT, prepare, services, start_worker, write_result
from tests.bench._engine_bench import engine_port, load_overhead, measure, table
from tests.bench.report import record_section
from tests.support import loopback, tiny_models
from tests.support.sglang_engine import SGLANG_BUNDLE, sglang_command, sglang_model

__all__ = ["SECTION", "main"]

SECTION = "## SGLang behind the worker"
MODEL = "bench/tiny-sglang-tp2"
SERVED = "bench/tiny-sglang"  # width 1, for the throughput rounds
STREAMS = (1, 8)
ENGINE_MODULE = "sglang.launch_server"


def section(result: dict[str, Any], command: str) -> str:
    by = {(c["path"], c["streams"]): c for c in result["cells"]}
    one = by[("worker", 1)]
    one_direct = by[("direct", 1)]
    ratio = one["tokens_per_s"] / one_direct["tokens_per_s"]
    added_ttft = (one["ttft_p50_s"] - one_direct["ttft_p50_s"]) * 1000
    load = result["load"]
    lines = [
        SECTION,
        "",
        f"`{command}`, {result['when']}, {result['machine']}. A real SGLang (SGLang "
        f"{result['sglang']} on cpu devices, tiny Llama, float32) at width 1, its launcher, "
        "scheduler and detokenizer on core 0 (the block's core, as the worker places them), "
        f"the worker and the client on core 1; {result['tokens']} tokens per streamed "
        f"completion, medians of {result['rounds']} alternating rounds per path.",
        "",
        *table(result["cells"], STREAMS, "SGLang launcher"),
        "",
        f"Load of the TP=2 model: {load['load_s']:.2f} s from the request to the answer; the "
        "engine's own start-up (its process's start to its first healthy `/health`, which in "
        f"SGLang runs a one-token generation) {load['engine_s']:.2f} s; the worker added "
        f"**{load['added_s']:.2f} s** (resolving the options, reading the model's shape for "
        "its KV cache and placing it before the spawn, readiness polling and registration "
        "after).",
        "",
        f"Targets (issue 46): worker >= 95% of direct tokens/s at 1 stream ({ratio:.1%}); "
        f"<= 5 ms added to TTFT p50 ({added_ttft:+.1f} ms); <= 1 s added to a load beyond the "
        f"engine's own start ({load['added_s']:.2f} s).",
    ]
    return "\n".join(lines) + "\n"


def _config(model_id: str, model_dir: Path, width: int) -> dict[str, Any]:
    """The model at ``width``, its batch as wide as the most streams measured (none waits)."""
    return sglang_model(
        model_id, model_dir, width=width, args=["--max-running-requests", str(max(STREAMS))]
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--no-record", action="store_true", help="print, do not write the doc")
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "benchmarks.md")
    args = parser.parse_args(argv)
    prepare()
    model_dir = OUT / "tiny-llama-32"
    if not (model_dir / "config.json").is_file():
        subprocess.run(
            [sys.executable, tiny_models.__file__, str(model_dir), "--head-dim", "32"], check=True
        )
    env = {
        "SIE_BUNDLE": SGLANG_BUNDLE,
        "SIE_SGLANG_COMMAND": sglang_command(),
        "SIE_DEVICES": "cpu:0,cpu:1",
    }
    client_core = {max(os.sched_getaffinity(0))}
    os.sched_setaffinity(0, client_core)
    with services() as started:
        worker = start_worker(
            "bench-sglang-worker",
            OUT / "sglang-configs",
            env=env,
            models=[_config(MODEL, model_dir, 2), _config(SERVED, model_dir, 1)],
            cpus=client_core,
        )
        started.append(worker)
        load = load_overhead(worker.url, ENGINE_MODULE, MODEL)
        with loopback.client(base_url=worker.url, timeout=600) as client:
            client.post(f"/v1/models/{MODEL}/unload").raise_for_status()
            client.post(f"/v1/models/{SERVED}/load").raise_for_status()
        engine = engine_port(ENGINE_MODULE, SERVED)
        assert engine is not None, "the engine is not running after its load"
        cells = measure(
            (worker.url, worker.proc.pid),
            f"http://127.0.0.1:{engine[0]}",
            engine[1].pid,
            SERVED,
            streams_list=STREAMS,
            rounds=args.rounds,
            tokens=args.tokens,
        )
    sglang = subprocess.run(
        [
            str(ROOT / ".venv-sglang" / "bin" / "python"),
            "-c",
            "import sglang; print(sglang.__version__)",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    result = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{psutil.cpu_count()} CPUs, load average {psutil.getloadavg()[0]:.1f}",
        "sglang": sglang,
        "tokens": args.tokens,
        "rounds": args.rounds,
        "cells": cells,
        "load": load,
    }
    write_result("sglang", result)
    command = ".venv/bin/python -m tests.bench.bench_sglang" + (
        f" --rounds {args.rounds}" if args.rounds != 7 else ""
    )
    text = section(result, command)
    print(text)
    if not args.no_record:
        record_section(args.output, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
