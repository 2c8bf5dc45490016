"""Placement decision time: ``allocator.place`` under random load / unload / use sequences.

200 models with widths 1 (55%), 2 (25%), 4 (12%) and 8 (8%), 3% of them pinned, on 8 and
on 64 devices. Each step loads a random unloaded model (65%: the timed ``place`` call,
then its evictions and claim are applied as the manager would), unloads a random loaded
one (20%) or marks one used (15%). Only ``place`` itself is timed (``perf_counter_ns``);
building the claim list is the manager's job and is not counted.

This machine is shared and oversubscribed, so a wall-clock sample also catches the times
the scheduler ran someone else. The sequence is deterministic, so every recorded decision
(its claims and width) is timed again in ``--repeats`` passes and each decision keeps its
fastest time ("filtered"); the first pass is reported as "raw". Target: filtered p99 <= 50 us
at 8 devices.

    .venv/bin/python -m tests.bench.bench_placement [--steps 10000] [--seed 9]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sie_worker.worker.placement.allocator import Claim, NoPlacement, place

from tests.bench._bench import summary, write_result

__all__ = ["main", "run"]

_WIDTHS = (1, 2, 4, 8)
_WIDTH_WEIGHTS = (0.55, 0.25, 0.12, 0.08)
_TARGET_P99_US = 50.0


@dataclass(frozen=True)
class _Model:
    name: str
    width: int
    pinned: bool


def run(devices: int, models: int, steps: int, seed: int, repeats: int) -> dict[str, Any]:
    rnd = random.Random(seed)
    catalog = [
        _Model(f"m{i}", rnd.choices(_WIDTHS, _WIDTH_WEIGHTS)[0], rnd.random() < 0.03)
        for i in range(models)
    ]
    catalog = [m for m in catalog if m.width <= devices]
    loaded: dict[str, Claim] = {}
    decisions: list[tuple[list[Claim], int]] = []
    raw_us: list[float] = []
    outcomes: Counter[str] = Counter()
    clock = 0.0
    for _ in range(steps):
        clock += 1.0
        roll = rnd.random()
        if roll < 0.65 or not loaded:
            model = rnd.choice([m for m in catalog if m.name not in loaded])
            claims = list(loaded.values())
            decisions.append((claims, model.width))
            started = time.perf_counter_ns()
            try:
                placement = place(devices, claims, model.width)
            except NoPlacement:
                raw_us.append((time.perf_counter_ns() - started) / 1000)
                outcomes["refused"] += 1
                continue
            raw_us.append((time.perf_counter_ns() - started) / 1000)
            outcomes["evicted" if placement.evict else "free block"] += 1
            for name in placement.evict:
                del loaded[name]
            loaded[model.name] = Claim(
                model.name, placement.start, model.width, model.pinned, clock
            )
        elif roll < 0.85:
            del loaded[rnd.choice(list(loaded))]
        else:
            name = rnd.choice(list(loaded))
            claim = loaded[name]
            loaded[name] = Claim(name, claim.start, claim.width, claim.pinned, clock)
    best = list(raw_us)
    for _ in range(repeats - 1):
        for index, (claims, width) in enumerate(decisions):
            started = time.perf_counter_ns()
            try:  # noqa: SIM105 - contextlib.suppress would be timed with the decision
                place(devices, claims, width)
            except NoPlacement:
                pass
            best[index] = min(best[index], (time.perf_counter_ns() - started) / 1000)
    return {
        "devices": devices,
        "models": len(catalog),
        "decisions": len(decisions),
        "repeats": repeats,
        "outcomes": dict(outcomes),
        "us": summary(best),
        "raw_us": summary(raw_us),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=10000)
    parser.add_argument("--models", type=int, default=200)
    parser.add_argument("--seed", type=int, default=9)
    parser.add_argument("--repeats", type=int, default=5, help="timing passes per decision")
    args = parser.parse_args(argv)
    runs = [run(devices, args.models, args.steps, args.seed, args.repeats) for devices in (8, 64)]
    p99 = runs[0]["us"]["p99"]
    result = {
        "command": "python -m tests.bench.bench_placement " + " ".join(argv or sys.argv[1:]),
        "runs": runs,
        "target": {
            "name": "place() p99 at 8 devices (filtered)",
            "limit_us": _TARGET_P99_US,
            "value_us": p99,
            "met": p99 is not None and p99 <= _TARGET_P99_US,
        },
    }
    write_result("placement", result)
    for r in runs:
        us = r["us"]
        print(
            f"{r['devices']:>3} devices x {r['models']} models: {r['decisions']} decisions, "
            f"p50 {us['p50']:.1f} us, p99 {us['p99']:.1f} us, max {us['max']:.1f} us "
            f"(raw p99 {r['raw_us']['p99']:.1f} us) {r['outcomes']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
