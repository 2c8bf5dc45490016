"""Placement decision time: ``allocator.place`` under random load / unload / use sequences.

200 models with widths 1 (55%), 2 (25%), 4 (12%) and 8 (8%), 3% of them pinned, on 8 and
on 64 devices, in three modes side by side in one run:

- **exclusive**: device memory unknown (``place(device count, ...)``), one model per device;
- **spread** and **pack**: 80 GiB devices whose budget is 95% of that (the worker's
  ``DeviceMemory.budgets``), each model with its need from ``memory_need`` (DESIGN "Device
  memory"): width 1 is 60% SGLang with ``mem_fraction_static`` 0.10-0.50, 25% SGLang with
  SIE's 0.85 default and 15% default-engine models of 0.2-16 GB of weights; groups are
  SGLang at 0.85 (half of them) or 0.50-0.90.

At 8 devices, spread and pack also run a **small** catalogue: 200 width-1 default-engine
models of 0.1-4 GB of weights, some 20 to a device, the most claims a decision reads.

Every mode draws the same catalogue (widths, pinning, needs) from the seed. Each step loads
a random unloaded model (65%: the timed ``place`` call, then its evictions and claim are
applied as the manager would), unloads a random loaded one (20%) or marks one used (15%).
Only ``place`` itself is timed (``perf_counter_ns``); building the claim list is the
manager's job and is not counted.

This machine is shared and oversubscribed, so a wall-clock sample also catches the times
the scheduler ran someone else. The sequence is deterministic, so every recorded decision
(its claims, width and need) is timed again in ``--repeats`` passes and each decision keeps
its fastest time ("filtered"); the first pass is reported as "raw". Target: filtered p99
<= 50 us at 8 devices x 200 models of the mixed catalogue, in every mode (the small
catalogue is a stress case, reported beside it).

Writes ``tests/bench/out/placement.json`` and the ``## 2. Placement decision time`` section
of ``docs/benchmarks.md`` (``tests/bench/run`` regenerates the same section from the JSON),
unless ``--no-record``.

    .venv/bin/python -m tests.bench.bench_placement [--steps 10000] [--seed 9] [--no-record]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from sie_worker.sizing.memory_needs import GIB, memory_need
from sie_worker.worker.placement.allocator import Claim, NoPlacement, Strategy, place
from sie_worker.worker.placement.memory import DeviceMemory

from tests.bench._bench import ROOT, summary, write_result

__all__ = ["MODES", "SECTION", "main", "run", "section"]

SECTION = "## 2. Placement decision time"
Mode = Literal["exclusive", "spread", "pack"]
Catalogue = Literal["mixed", "small"]
MODES: tuple[Mode, ...] = ("exclusive", "spread", "pack")
DEVICE_TOTAL = 80 * GIB
_WIDTHS = (1, 2, 4, 8)
_WIDTH_WEIGHTS = (0.55, 0.25, 0.12, 0.08)
_TARGET_P99_US = 50.0


@dataclass(frozen=True)
class _Model:
    name: str
    width: int
    pinned: bool
    need: int


def _need(rnd: random.Random, width: int) -> int:
    """A realistic need on each device of an 80 GiB GPU (``memory_need``, the worker's rule)."""
    roll = rnd.random()
    need: int | None
    if width == 1 and roll < 0.60:  # small SGLang models: embeddings, rerankers, 7-8B chat
        need = memory_need("sglang", DEVICE_TOTAL, mem_fraction=round(rnd.uniform(0.1, 0.5), 2))
    elif width == 1 and roll < 0.85:  # SGLang at SIE's default fraction: a device of its own
        need = memory_need("sglang", DEVICE_TOTAL)
    elif width == 1:  # the default engine: its weight files x 1.2 + 1 GiB
        need = memory_need(
            "transformers", DEVICE_TOTAL, weights_bytes=int(rnd.uniform(0.2, 16) * 1e9)
        )
    else:
        fraction = None if roll < 0.5 else round(rnd.uniform(0.5, 0.9), 2)
        need = memory_need("sglang", DEVICE_TOTAL, mem_fraction=fraction)
    assert need is not None
    return need


def _catalog(models: int, seed: int, kind: Catalogue = "mixed") -> list[_Model]:
    """The same models for every mode: widths, pinning and needs drawn from ``seed``.

    ``mixed``: widths 1/2/4/8 as above. ``small``: every model width 1 on the default
    engine with 0.1-4 GB of weights (embedding and reranking models), so some 20 share each
    device: the most claims a decision reads.
    """
    rnd = random.Random(seed)
    out = []
    for i in range(models):
        width = rnd.choices(_WIDTHS, _WIDTH_WEIGHTS)[0] if kind == "mixed" else 1
        pinned = rnd.random() < 0.03
        if kind == "mixed":
            need = _need(rnd, width)
        else:
            weights = int(rnd.uniform(0.1, 4) * 1e9)
            need = memory_need("transformers", DEVICE_TOTAL, weights_bytes=weights) or 0
        out.append(_Model(f"m{i}", width, pinned, need))
    return out


def run(
    devices: int,
    mode: Mode,
    models: int,
    steps: int,
    seed: int,
    repeats: int,
    kind: Catalogue = "mixed",
) -> dict[str, Any]:
    memory = mode != "exclusive"
    budgets: int | tuple[int | None, ...] = (
        DeviceMemory("budget", (DEVICE_TOTAL,) * devices).budgets() if memory else devices
    )
    strategy: Strategy = "pack" if mode == "pack" else "spread"
    models_here = [m for m in _catalog(models, seed, kind) if m.width <= devices]
    rnd = random.Random(seed + devices)  # the same step sequence for every mode
    loaded: dict[str, Claim] = {}
    decisions: list[tuple[list[Claim], int, int | None]] = []
    raw_us: list[float] = []
    outcomes: Counter[str] = Counter()
    residents: list[int] = []  # models on the devices after each load
    clock = 0.0
    for _ in range(steps):
        clock += 1.0
        roll = rnd.random()
        if roll < 0.65 or not loaded:
            model = rnd.choice([m for m in models_here if m.name not in loaded])
            claims = list(loaded.values())
            need = model.need if memory else None
            decisions.append((claims, model.width, need))
            started = time.perf_counter_ns()
            try:
                placement = place(budgets, claims, model.width, need=need, strategy=strategy)
            except NoPlacement:
                raw_us.append((time.perf_counter_ns() - started) / 1000)
                outcomes["refused"] += 1
                continue
            raw_us.append((time.perf_counter_ns() - started) / 1000)
            outcomes["evicted" if placement.evict else "fits"] += 1
            for name in placement.evict:
                del loaded[name]
            loaded[model.name] = Claim(
                model.name, placement.start, model.width, model.pinned, clock, memory=need
            )
            residents.append(len(loaded))
        elif roll < 0.85:
            del loaded[rnd.choice(list(loaded))]
        else:
            name = rnd.choice(list(loaded))
            old = loaded[name]
            loaded[name] = Claim(
                name, old.start, old.width, old.pinned, clock, memory=old.memory
            )  # fmt: skip
    best = list(raw_us)
    for _ in range(repeats - 1):
        for index, (claims, width, need) in enumerate(decisions):
            started = time.perf_counter_ns()
            try:  # noqa: SIM105 - contextlib.suppress would be timed with the decision
                place(budgets, claims, width, need=need, strategy=strategy)
            except NoPlacement:
                pass
            best[index] = min(best[index], (time.perf_counter_ns() - started) / 1000)
    return {
        "devices": devices,
        "mode": mode,
        "catalogue": kind,
        "models": len(models_here),
        "decisions": len(decisions),
        "repeats": repeats,
        "outcomes": dict(outcomes),
        "models_loaded_mean": sum(residents) / len(residents) if residents else 0.0,
        "us": summary(best),
        "raw_us": summary(raw_us),
    }


def section(placement: Mapping[str, Any] | None, command: str | None = None) -> str:
    """The ``2. Placement decision time`` section (without its heading) from the results."""
    if placement is None:
        return "Not measured (see `tests/bench/out/placement.log`).\n"
    rows = [
        "| devices | models | mode | decisions | models loaded (mean) | p50 µs | p99 µs "
        "| max µs | raw p50 / p99 µs | outcomes |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in placement["runs"]:
        us, raw = r["us"], r["raw_us"]
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(r["outcomes"].items()))
        rows.append(
            f"| {r['devices']} | {r['models']} {r.get('catalogue', 'mixed')} | "
            f"{r.get('mode', 'exclusive')} | {r['decisions']} | "
            f"{r.get('models_loaded_mean', 0):.1f} | {us['p50']:.1f} | {us['p99']:.1f} | "
            f"{us['max']:.1f} | {raw['p50']:.1f} / {raw['p99']:.1f} | {outcomes} |"
        )
    target = placement["target"]
    lines = [
        "`sie_worker.worker.placement.allocator.place` on a random sequence (fixed seed) of "
        "loads (65%), unloads (20%) and uses (15%) of 200 models of widths 1/2/4/8 "
        "(55/25/12/8%), 3% pinned; each load is one timed decision whose evictions and "
        "claim are then applied. Three modes, same catalogue: **exclusive** (memory "
        "unknown: one model per device), and **spread** / **pack** (80 GiB devices, budget "
        "95%; width 1: 60% SGLang at `mem_fraction_static` 0.10-0.50, 25% at the 0.85 "
        "default, 15% default engine with 0.2-16 GB of weights; groups SGLang at 0.50-0.90). "
        "The **small** catalogue is the most claims a decision reads: 200 width-1 "
        "default-engine models of 0.1-4 GB of weights (embeddings, rerankers), some 20 to a "
        "device. Every recorded decision is timed again in "
        f"{placement['runs'][0]['repeats']} passes and keeps its fastest time; the first "
        'pass ("raw") includes whatever else the shared machine was doing.',
        "",
        *rows,
        "",
        f"Target: filtered p99 ≤ {target['limit_us']:.0f} µs at 8 devices x 200 mixed models "
        "in every mode: "
        f"worst {target['value_us']:.1f} µs ({target.get('worst_mode', 'exclusive')}), "
        f"{'met' if target['met'] else 'not met'}. A decision's cost grows with the claims "
        "it reads: with memory, width-1 models share devices, so more are loaded at once"
        f"{_stress(placement['runs'])}. `place()` rebuilds its per-device index from the "
        "claim list on every call (one pass, most of the time there) and, when nothing "
        "fits, sorts each open device's residents by last use; keeping that index between "
        "decisions in the manager would make a decision independent of the claim count. At "
        "64 devices a group decision scans up to 64 windows, so it grows with devices x "
        "width; no target is set there.",
        "",
    ]
    if command:
        lines += [f"Command: `{command}`{_when(placement)}.", ""]
    return "\n".join(lines)


def _stress(runs: Sequence[Mapping[str, Any]]) -> str:
    """The small catalogue's figures at 8 devices, as a clause (empty where it did not run)."""
    small = [r for r in runs if r.get("catalogue") == "small" and r["devices"] == 8]
    if not small:
        return ""
    loaded = max(r["models_loaded_mean"] for r in small)
    worst = max(r["us"]["p99"] for r in small)
    return f" (the small catalogue: {loaded:.0f} on 8 devices, p99 up to {worst:.1f} µs)"


def _when(result: Mapping[str, Any]) -> str:
    """When and on how busy a machine the figures were taken, where the result says."""
    if "started" not in result:
        return ""
    return (
        f", {result['started']}, 1-minute load average {result['loadavg']:.1f} at the end on "
        f"{result['cpus']} CPUs (shared: figures are noisy)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=10000)
    parser.add_argument("--models", type=int, default=200)
    parser.add_argument("--seed", type=int, default=9)
    parser.add_argument("--repeats", type=int, default=5, help="timing passes per decision")
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "benchmarks.md")
    parser.add_argument("--no-record", action="store_true", help="print, do not write the doc")
    args = parser.parse_args(argv)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    cases: list[tuple[int, Mode, Catalogue]] = [
        *((8, mode, "mixed") for mode in MODES),
        (8, "spread", "small"),
        (8, "pack", "small"),
        *((64, mode, "mixed") for mode in MODES),
    ]
    runs = [
        run(devices, mode, args.models, args.steps, args.seed, args.repeats, kind)
        for devices, mode, kind in cases
    ]
    at_8 = [r for r in runs if r["devices"] == 8 and r["catalogue"] == "mixed"]
    worst = max(at_8, key=lambda r: r["us"]["p99"])
    p99 = worst["us"]["p99"]
    given = list(sys.argv[1:] if argv is None else argv)
    command = " ".join([".venv/bin/python -m tests.bench.bench_placement", *given])
    result = {
        "command": command,
        "started": started,
        "loadavg": os.getloadavg()[0],
        "cpus": len(os.sched_getaffinity(0)),
        "runs": runs,
        "target": {
            "name": "place() p99 at 8 devices (filtered), worst mode",
            "limit_us": _TARGET_P99_US,
            "value_us": p99,
            "raw_us": worst["raw_us"]["p99"],
            "worst_mode": f"{worst['mode']}, {worst['catalogue']}",
            "met": p99 is not None and p99 <= _TARGET_P99_US,
        },
    }
    write_result("placement", result)
    for r in runs:
        us = r["us"]
        print(
            f"{r['devices']:>3} devices x {r['models']} {r['catalogue']} models, "
            f"{r['mode']:9}: "
            f"{r['decisions']} decisions, {r['models_loaded_mean']:.1f} loaded, "
            f"p50 {us['p50']:.1f} us, p99 {us['p99']:.1f} us, max {us['max']:.1f} us "
            f"(raw p99 {r['raw_us']['p99']:.1f} us) {r['outcomes']}"
        )
    text = f"{SECTION}\n\n{section(result, command)}"
    if args.no_record:
        print("\n" + text)
    else:
        from tests.bench.report import record_section  # report imports this module

        record_section(args.output, text)
        print(f"\nwrote the '{SECTION[3:]}' section of {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
