"""A simulated day: 20 small models on a few 80 GB GPUs, exclusive claims vs sharing.

The models (embedding, reranking and 3-8B chat models; shapes from their ``config.json``)
are sized with seed 004's arithmetic (``sie_worker.sizing``): weights (BF16) plus the KV
cache of a small workload (chat: 16 sequences of 4,096 tokens; embedding and reranking:
32 of 512), so ``mem_fraction_static`` = that need over the GPU (``suggest_fraction``, at
least 0.10); each reserves ``f x total + 1 GiB`` (``memory_need``). A load is the cold start
of Example 17: start-up (20 s) + weights / local NVMe (3 GB/s) + warm-up (40 s).

Traffic: ``--requests`` a day over the 20 models with Zipf-like popularity (share of the
k-th most popular ~ 1 / k^``--zipf``, ranks shuffled by the seed), arriving as Poisson
processes whose rate follows the day: interactive models peak at 14:00, the three batch
embedding models (overnight indexing) at 02:00, each at 1.8x its mean and 0.2x at the
opposite hour. One trace, replayed by ``tests.bench.sharing_sim`` for every approach:
**exclusive** (memory unknown: one model per GPU, as before sharing) on 4-20 GPUs,
**spread** and **pack** (models share a GPU while their reservations fit 95% of it) on 1-6.
LRU eviction as the worker does. Deterministic: same seed, same figures.

Writes ``tests/bench/out/sharing.json`` and the ``## Sharing GPUs: a simulated day``
section of ``docs/benchmarks.md`` (replaced, or added at the end), unless ``--no-record``.

    .venv/bin/python -m tests.bench.bench_sharing [--requests 100000] [--seed 4] [--no-record]
"""

from __future__ import annotations

import argparse
import itertools
import math
import random
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sie_worker.sizing.arithmetic import Shape, kv_bytes_per_token, weights_bytes
from sie_worker.sizing.cold_start import WeightSource, cold_starts
from sie_worker.sizing.memory_needs import GIB, memory_need
from sie_worker.sizing.packing import suggest_fraction

from tests.bench._bench import ROOT, percentile, write_result
from tests.bench.report import record_section
from tests.bench.sharing_sim import APPROACHES, DayResult, Request, SimModel, simulate

__all__ = ["SECTION", "Sized", "day_trace", "fewest_gpus", "main", "section", "small_models"]

SECTION = "## Sharing GPUs: a simulated day"
DAY_S = 86400.0
GPU_BYTES = 80 * 10**9  # "80 GB", as seed 004 counts
MIN_FRACTION = 0.10
SOURCE = WeightSource("local NVMe, 3 GB/s", 3e9)
EXCLUSIVE_GPUS = range(4, 21)  # 20: every model on a GPU of its own
SHARED_GPUS = range(1, 7)
# (context tokens, sequences) the KV cache is sized for.
_WORKLOADS = {"chat": (4096, 16), "embedding": (512, 32), "reranker": (512, 32)}
# name, kind, parameters, layers, attention heads, KV heads, head_dim, peaks at night
_SPECS: tuple[tuple[str, str, float, int, int, int, int, bool], ...] = (
    ("BAAI/bge-m3", "embedding", 568e6, 24, 16, 16, 64, True),
    ("BAAI/bge-large-en-v1.5", "embedding", 335e6, 24, 16, 16, 64, False),
    ("intfloat/multilingual-e5-large", "embedding", 560e6, 24, 16, 16, 64, True),
    ("nomic-ai/nomic-embed-text-v1.5", "embedding", 137e6, 12, 12, 12, 64, False),
    ("Alibaba-NLP/gte-Qwen2-1.5B-instruct", "embedding", 1.78e9, 28, 12, 2, 128, False),
    ("Qwen/Qwen3-Embedding-0.6B", "embedding", 0.6e9, 28, 16, 8, 128, False),
    ("Qwen/Qwen3-Embedding-4B", "embedding", 4.02e9, 36, 32, 8, 128, True),
    ("intfloat/e5-mistral-7b-instruct", "embedding", 7.11e9, 32, 32, 8, 128, False),
    ("BAAI/bge-reranker-v2-m3", "reranker", 568e6, 24, 16, 16, 64, False),
    ("BAAI/bge-reranker-large", "reranker", 560e6, 24, 16, 16, 64, False),
    ("Qwen/Qwen3-Reranker-0.6B", "reranker", 0.6e9, 28, 16, 8, 128, False),
    ("Qwen/Qwen3-Reranker-4B", "reranker", 4.02e9, 36, 32, 8, 128, False),
    ("meta-llama/Llama-3.1-8B-Instruct", "chat", 8.03e9, 32, 32, 8, 128, False),
    ("Qwen/Qwen2.5-7B-Instruct", "chat", 7.62e9, 28, 28, 4, 128, False),
    ("mistralai/Mistral-7B-Instruct-v0.3", "chat", 7.25e9, 32, 32, 8, 128, False),
    ("Qwen/Qwen3-8B", "chat", 8.19e9, 36, 32, 8, 128, False),
    ("ibm-granite/granite-3.1-8b-instruct", "chat", 8.17e9, 40, 32, 8, 128, False),
    ("meta-llama/Llama-3.2-3B-Instruct", "chat", 3.21e9, 28, 24, 8, 128, False),
    ("microsoft/Phi-3.5-mini-instruct", "chat", 3.82e9, 32, 32, 32, 96, False),
    ("google/gemma-2-2b-it", "chat", 2.61e9, 26, 8, 4, 256, False),
)


@dataclass(frozen=True)
class Sized:
    """One model of the day, with its arithmetic."""

    model: SimModel
    kind: str
    weights_bytes: float
    kv_bytes: float
    fraction: float
    night: bool


def small_models(
    gpu_bytes: int = GPU_BYTES, *, startup_s: float = 20.0, warmup_s: float = 40.0
) -> list[Sized]:
    """The 20 models, sized for ``gpu_bytes`` GPUs."""
    out = []
    for name, kind, params, layers, heads, kv_heads, head_dim, night in _SPECS:
        weights = weights_bytes(params, 16)
        context, sequences = _WORKLOADS[kind]
        kv = kv_bytes_per_token(Shape(layers, heads, kv_heads, head_dim)) * context * sequences
        fraction = max(MIN_FRACTION, suggest_fraction(weights + kv, gpu_bytes))
        need = memory_need("sglang", gpu_bytes, mem_fraction=fraction)
        assert need is not None
        (cold,) = cold_starts([(name, weights)], [SOURCE], startup_s=startup_s, warmup_s=warmup_s)
        out.append(Sized(SimModel(name, need, cold.total_s), kind, weights, kv, fraction, night))
    return out


def day_trace(
    models: Sequence[Sized], requests_per_day: int, seed: int, zipf: float = 1.1
) -> tuple[list[Request], dict[str, float]]:
    """One day of requests in time order, and each model's share of the day's traffic."""
    rnd = random.Random(seed)
    ranks = list(range(1, len(models) + 1))
    rnd.shuffle(ranks)
    weights = [1 / rank**zipf for rank in ranks]
    shares = {m.model.name: w / sum(weights) for m, w in zip(models, weights, strict=True)}
    amplitude = 0.8
    out: list[Request] = []
    for sized in models:
        name = sized.model.name
        peak = (2 if sized.night else 14) * 3600.0
        top = requests_per_day * shares[name] / DAY_S * (1 + amplitude)
        t = rnd.expovariate(top)
        while t < DAY_S:  # thinning: a Poisson process at the peak rate, kept by the hour
            if rnd.random() * (1 + amplitude) < 1 + amplitude * math.cos(
                2 * math.pi * (t - peak) / DAY_S
            ):
                out.append(Request(t, name))
            t += rnd.expovariate(top)
    out.sort(key=lambda r: (r.at, r.model))
    return out, shares


def _row(result: DayResult) -> dict[str, Any]:
    waits = result.waits_s
    return {
        "approach": result.approach,
        "gpus": result.gpus,
        "loads": result.loads,
        "waited": result.waited,
        "waited_share": result.waited / result.requests if result.requests else 0.0,
        "wait_mean_s": result.wait_total_s / len(waits) if waits else 0.0,
        "wait_p99_s": percentile(waits, 0.99) if waits else 0.0,
        "wait_max_s": max(waits, default=0.0),
        "wait_total_h": result.wait_total_s / 3600,
        "deferred_loads": result.deferred_loads,
        "budget_bytes": result.budget_bytes,
        "peak_models_per_gpu": max(result.peak_models),
        "peak_shared_share": (
            max(result.peak_shared_bytes) / result.budget_bytes if result.budget_bytes else None
        ),
    }


def fewest_gpus(rows: Sequence[Mapping[str, Any]], approach: str, max_loads: int) -> int | None:
    """The fewest GPUs in the sweep on which ``approach`` needed at most ``max_loads``."""
    fits = [r["gpus"] for r in rows if r["approach"] == approach and r["loads"] <= max_loads]
    return min(fits, default=None)


def section(result: Mapping[str, Any], command: str) -> str:
    rows, n = result["rows"], result["max_loads"]
    lines = [
        SECTION,
        "",
        f"{result['requests']:,} requests over one day to 20 small models (seed "
        f"{result['seed']}, Zipf {result['zipf']}), replayed on 80 GB GPUs by "
        "`tests/bench/sharing_sim.py`: every placement is the worker's own `place()`, LRU "
        "eviction, loads serialized per GPU; requests take no time once their model is ready, "
        "so this counts residency (loads and the waits for them), not compute. **exclusive**: "
        "memory unknown, one model per GPU; **spread** / **pack**: models share a GPU while "
        "their reservations fit 95% of it.",
        "",
        "| approach | GPUs | loads | requests that waited | wait mean / p99 / max s | "
        "wait total h | most models on a GPU | most reserved on a shared GPU / budget |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        share = r["peak_shared_share"]
        lines.append(
            f"| {r['approach']} | {r['gpus']} | {r['loads']:,} | {r['waited']:,} "
            f"({r['waited_share']:.2%}) | {r['wait_mean_s']:.0f} / {r['wait_p99_s']:.0f} / "
            f"{r['wait_max_s']:.0f} | {r['wait_total_h']:.1f} | {r['peak_models_per_gpu']} | "
            f"{'-' if share is None else f'{share:.1%}'} |"
        )
    fewest = result["fewest_gpus"]

    def gpus(approach: str, sweep: range) -> str:
        value = fewest[approach]
        return f"more than {sweep[-1]}" if value is None else str(value)

    at4 = {r["approach"]: r for r in rows if r["gpus"] == 4}
    lines += [
        "",
        f"Fewest GPUs that serve the day with at most {n} loads (the first load of every "
        f"model included): exclusive {gpus('exclusive', EXCLUSIVE_GPUS)}, spread "
        f"{gpus('spread', SHARED_GPUS)}, pack {gpus('pack', SHARED_GPUS)}. On 4 GPUs: "
        + ", ".join(
            f"{a} {at4[a]['loads']:,} loads and {at4[a]['waited']:,} waiting requests"
            for a in APPROACHES
            if a in at4
        )
        + ".",
        "",
        *_reading(result),
        "",
        "The models (reservation = `mem_fraction_static` x 80 GB + 1 GiB; cold start = 20 s "
        "+ weights / 3 GB/s + 40 s):",
        "",
        "| model | kind | weights GB | KV GB | f | reserved GiB | cold start s | traffic |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for m in result["models"]:
        lines.append(
            f"| {m['name']} | {m['kind']}{' (night)' if m['night'] else ''} | "
            f"{m['weights_bytes'] / 1e9:.1f} | {m['kv_bytes'] / 1e9:.1f} | {m['fraction']:.2f} | "
            f"{m['need_bytes'] / GIB:.1f} | {m['load_s']:.0f} | {m['share']:.1%} |"
        )
    when = f", {result['started']}" if "started" in result else ""
    lines += ["", f"Command: `{command}`{when} ({result['cpu_s']:.1f} s of CPU).", ""]
    return "\n".join(lines)


def _reading(result: Mapping[str, Any]) -> list[str]:
    """What the table shows, from its own figures."""
    rows = result["rows"]
    total = sum(m["need_bytes"] for m in result["models"])
    budget = next(r["budget_bytes"] for r in rows if r["budget_bytes"] is not None)
    lines = [
        f"The 20 reservations add up to {total / GIB:.0f} GiB, {total / budget:.2f} GPUs' "
        f"budgets ({budget / GIB:.1f} GiB each), so fewer than {math.ceil(total / budget)} GPUs "
        "cannot hold them all at once: the models beyond what fits take turns, and LRU "
        "evicts a model that is soon asked for again. Exclusive claims hold one model per "
        "GPU, so below 20 GPUs the same happens with far less room."
    ]
    exclusive = [r for r in rows if r["approach"] == "exclusive"]
    rises = [b for a, b in itertools.pairwise(exclusive) if b["loads"] > a["loads"]]
    if rises:
        lines[0] += (
            f" Exclusive loads rise with GPUs up to {rises[-1]['gpus']}: "
            "with few GPUs every GPU is loading most of the time and a loading model cannot "
            "be evicted, so more requests wait for a load already under way (and wait longer)."
        )
    lines += [
        "",
        "Not modelled: compute. Models sharing a GPU share its SMs and memory bandwidth, so "
        "a busy model beside others serves fewer tokens/s than alone; these figures are "
        "about memory residency only.",
    ]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=100_000, help="requests in the day")
    parser.add_argument("--seed", type=int, default=4)
    parser.add_argument("--zipf", type=float, default=1.1, help="popularity skew exponent")
    parser.add_argument("--max-loads", type=int, default=50, help="loads a day to stay within")
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "benchmarks.md")
    parser.add_argument("--no-record", action="store_true", help="print, do not write the doc")
    args = parser.parse_args(argv)
    started = time.process_time()
    sized = small_models()
    models = [s.model for s in sized]
    trace, shares = day_trace(sized, args.requests, args.seed, args.zipf)
    runs = [("exclusive", g) for g in EXCLUSIVE_GPUS]
    runs += [(a, g) for a in ("spread", "pack") for g in SHARED_GPUS]
    rows = []
    for approach, gpus in runs:
        day = simulate(models, trace, gpus, approach, gpu_bytes=GPU_BYTES)  # type: ignore[arg-type]
        rows.append(_row(day))
        r = rows[-1]
        print(
            f"{approach:9} {gpus:2} GPUs: {r['loads']:6,} loads, {r['waited']:6,} requests "
            f"waited (mean {r['wait_mean_s']:.0f} s, p99 {r['wait_p99_s']:.0f} s), "
            f"up to {r['peak_models_per_gpu']} models on a GPU",
            flush=True,
        )
    rows.sort(key=lambda r: (APPROACHES.index(r["approach"]), r["gpus"]))
    fewest = {a: fewest_gpus(rows, a, args.max_loads) for a in APPROACHES}
    at4 = {r["approach"]: r for r in rows if r["gpus"] == 4}
    met = (
        at4["spread"]["loads"] < at4["exclusive"]["loads"]
        and fewest["spread"] is not None
        and (fewest["exclusive"] is None or fewest["spread"] < fewest["exclusive"])
    )
    result = {
        "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "requests": len(trace),
        "seed": args.seed,
        "zipf": args.zipf,
        "max_loads": args.max_loads,
        "models": [
            {
                **asdict(s.model),
                "kind": s.kind,
                "weights_bytes": s.weights_bytes,
                "kv_bytes": s.kv_bytes,
                "fraction": s.fraction,
                "night": s.night,
                "share": shares[s.model.name],
            }
            for s in sized
        ],
        "rows": rows,
        "fewest_gpus": fewest,
        "target": {"met": met, "loads_at_4": {a: at4[a]["loads"] for a in at4}},
        "cpu_s": time.process_time() - started,
    }
    write_result("sharing", result)
    given = list(sys.argv[1:] if argv is None else argv)
    text = section(result, " ".join([".venv/bin/python -m tests.bench.bench_sharing", *given]))
    if args.no_record:
        print("\n" + text)
    else:
        record_section(args.output, text)
        print(f"\nwrote the '{SECTION[3:]}' section of {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
