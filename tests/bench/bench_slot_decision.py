"""The slot router's routing decision per request, against how many models its workers list.

Each request the router relays starts with ``SlotTable.decide``: a view of every slot (its
last poll, the dispatches since, the router's own in-flight counts) and the pure policy over
them. A worker lists every configured model in ``/v1/models`` (its whole catalogue, loaded or
not), so a view costs what it copies per listed model. This times the decision over pods of
1, 4 and 8 slots whose workers list 1 to 200 models (the first one ready with requests in
flight, the rest unloaded), two ways side by side in one run: the views as the router builds
them (``SlotState.view``: only the models the router counts more requests on are rebuilt)
and built the long way (every listed model rebuilt per view, as the router did until
2026-12-04). Each figure is the best of ``--repeats`` passes of ``--decisions`` decisions.

    .venv/bin/python -m tests.bench.bench_slot_decision [--decisions 2000] [--repeats 5]

Writes ``tests/bench/out/slot_decision.json`` and prints one table; docs/benchmarks.md quotes
it by hand ("Data path").
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from sie_worker.router.metrics import RouterMetrics
from sie_worker.router.policy import ModelView, SlotView, record_dispatch, record_served
from sie_worker.router.settings import RouterSettings
from sie_worker.router.state import SlotState, SlotTable

from tests.bench._bench import write_result

__all__ = ["main", "table_of", "view_rebuilding_every_model"]

_MODEL = "m0"


def view_rebuilding_every_model(state: SlotState) -> SlotView:
    """``SlotState.view`` as it was: every listed model rebuilt with its in-flight count."""
    base = state.polled or SlotView(index=state.index)
    for _, model, served in state.pending:
        base = record_served(base, model) if served else record_dispatch(base, model)
    counts = state.inflight_by_model
    models = {
        name: replace(v, inflight=max(v.inflight, counts.get(name, 0)))
        for name, v in base.models.items()
    }
    return replace(base, up=state.up, outstanding=state.outstanding, models=models)


def table_of(slots: int, models: int) -> SlotTable:
    """A pod of ``slots`` one-GPU slots, each worker listing ``models`` models: ``m0`` ready
    with 2 requests the worker counts and 3 the router sent, the others unloaded."""
    settings = RouterSettings(worker_ports=tuple(range(9000, 9000 + slots)))
    table = SlotTable(settings, RouterMetrics(slots))
    listed = {f"m{j}": ModelView("unloaded", last_used=1.0) for j in range(models)}
    listed[_MODEL] = ModelView("ready", last_used=2.0, inflight=2)
    for slot in range(slots):
        table.apply_poll(slot, 0.0, dict(listed), (("cuda:0", _MODEL),), True)
        for _ in range(3):
            table.dispatched(slot, _MODEL, "ready")
    return table


def _best_us(table: SlotTable, view: Callable[[SlotState], SlotView], args: Any) -> float:
    best = float("inf")
    for _ in range(args.repeats):
        start = time.perf_counter()
        for _ in range(args.decisions):
            decision = table.policy(_MODEL, [view(s) for s in table.slots])
        best = min(best, (time.perf_counter() - start) / args.decisions * 1e6)
        if decision is None or decision.reason != "ready":
            raise RuntimeError(f"the decision over {len(table.slots)} slots was {decision}")
    return best


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--decisions", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--slots", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--models", type=int, nargs="+", default=[1, 20, 50, 200])
    args = parser.parse_args(argv)
    cells: list[dict[str, Any]] = []
    lines = [
        "| slots | models listed per worker | decision now (µs) | every model rebuilt (µs) |",
        "|---:|---:|---:|---:|",
    ]
    for slots in args.slots:
        for models in args.models:
            table = table_of(slots, models)
            now = _best_us(table, SlotState.view, args)
            before = _best_us(table, view_rebuilding_every_model, args)
            cells.append({"slots": slots, "models": models, "now_us": now, "before_us": before})
            lines.append(f"| {slots} | {models} | {now:.1f} | {before:.1f} |")
            print(lines[-1], flush=True)
    write_result("slot_decision", {"cells": cells, "args": vars(args)})
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
