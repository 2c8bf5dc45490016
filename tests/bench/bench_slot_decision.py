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

Then the prefix-aware decision with the prefix index full (:func:`prefix_decision`): per
request, the prompt's block hashes, the index's match, the policy and the record of the
blocks, for the gateway over 50 pods x 200 models (``choose``) and for the router over 8
slots whose workers list 200 models (``SlotTable.decide``); each request's fastest of
``--repeats`` passes (the machine is shared), p50 / p99 / max. And the full index's memory
(tracemalloc).

Writes ``tests/bench/out/slot_decision.json`` and prints the tables; docs/benchmarks.md quotes
them by hand ("Data path", "Prefix-aware routing").
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from sie_worker.backends.prefix import (
    DEFAULT_INDEX_BLOCKS,
    PrefixConfig,
    PrefixIndex,
    prompt_blocks,
)
from sie_worker.gateway.metrics import GatewayMetrics
from sie_worker.gateway.policy import choose
from sie_worker.gateway.pools import PoolSpec
from sie_worker.gateway.settings import GatewaySettings
from sie_worker.gateway.state import Endpoint, Fleet, PodPoll
from sie_worker.router.metrics import RouterMetrics
from sie_worker.router.policy import ModelView, SlotView, record_dispatch, record_served
from sie_worker.router.settings import RouterSettings
from sie_worker.router.state import SlotState, SlotTable

from tests.bench._bench import write_result

__all__ = [
    "index_bytes",
    "main",
    "prefix_decision",
    "table_of",
    "view_rebuilding_every_model",
]

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
            decision = table.policy(_MODEL, [view(s) for s in table.slots], None)
        best = min(best, (time.perf_counter() - start) / args.decisions * 1e6)
        if decision is None or decision.reason != "ready":
            raise RuntimeError(f"the decision over {len(table.slots)} slots was {decision}")
    return best


_SYSTEM = "You are a careful agent. Use the tools when they help. " * 40  # ~2,200 chars


def _conversation(rnd: random.Random, turns: int) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": _SYSTEM}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"step {rnd.getrandbits(64)} " * 30})
        messages.append({"role": "assistant", "content": f"done {turn} " * 40})
    return messages


def _fleet(
    pods: int, models: int, rnd: random.Random, index_blocks: int = DEFAULT_INDEX_BLOCKS
) -> tuple[Fleet, list[str]]:
    spec = PoolSpec("bench", "sglang", "l4", "l4", slots=4, service="s", port=1)
    settings = GatewaySettings(Path("pools.yaml"), prefix=PrefixConfig(index_blocks=index_blocks))
    fleet = Fleet(settings, (spec,), GatewayMetrics([spec.key]))
    fleet.set_endpoints(
        spec.key, [Endpoint(f"pod-{i}", f"http://10.0.0.{i}:8080") for i in range(pods)]
    )
    names = [f"org/model-{m}" for m in range(models)]
    for pod in fleet.groups[spec.key].pods.values():
        listing = {m: rnd.choice(("unloaded", "unloaded", "loading", "ready")) for m in names}
        fleet.apply_poll(pod, 0.0, PodPoll(listing, {}, rnd.randint(0, 1), 4, 4, True))
        pod.outstanding = rnd.randint(0, 24)
    return fleet, names


def _requests(rnd: random.Random, names: list[str], count: int) -> list[tuple[str, dict[str, Any]]]:
    """``count`` chat requests: half continue one of 64 conversations, half start new ones."""
    ongoing = [(rnd.choice(names), _conversation(rnd, rnd.randint(0, 6))) for _ in range(64)]
    out = []
    for _ in range(count):
        model, messages = rnd.choice(ongoing)
        if rnd.random() < 0.5:
            model, messages = rnd.choice(names), _conversation(rnd, rnd.randint(0, 3))
        out.append((model, {"messages": messages[: rnd.randint(1, len(messages))]}))
    return out


def _fill(
    record: Callable[[tuple[int, ...], Any], None],
    full: Callable[[], bool],
    targets: Sequence[Any],
    rnd: random.Random,
) -> None:
    config = PrefixConfig()
    while not full():
        payload = {"messages": _conversation(rnd, rnd.randint(1, 8))}
        record(
            prompt_blocks(config, f"org/model-{rnd.randrange(200)}", payload), rnd.choice(targets)
        )


def _timed(
    step: Callable[[str, dict[str, Any]], object],
    requests: list[tuple[str, dict[str, Any]]],
    repeats: int,
) -> dict[str, float]:
    best = [float("inf")] * len(requests)
    for _ in range(repeats):
        for i, (model, payload) in enumerate(requests):
            started = time.perf_counter_ns()
            step(model, payload)
            best[i] = min(best[i], (time.perf_counter_ns() - started) / 1000)
    ordered = sorted(best)
    return {
        "p50_us": ordered[len(ordered) // 2],
        "p99_us": ordered[int(len(ordered) * 0.99)],
        "max_us": ordered[-1],
    }


def prefix_decision(
    decisions: int,
    repeats: int,
    *,
    pods: int = 50,
    models: int = 200,
    index_blocks: int = DEFAULT_INDEX_BLOCKS,
) -> dict[str, Any]:
    """The prefix-aware decision, index full, for the gateway and the router."""
    rnd = random.Random(16)
    fleet, names = _fleet(pods, models, rnd, index_blocks)
    key = next(iter(fleet.groups))
    pod_keys = [(key, name) for name in fleet.groups[key].pods]
    index = fleet.prefixes
    _fill(index.record, lambda: len(index) >= index.max_blocks, pod_keys, rnd)
    requests = _requests(rnd, names, decisions)
    config = fleet.settings.prefix

    def gateway(model: str, payload: dict[str, Any]) -> object:
        blocks = prompt_blocks(config, model, payload)
        decision = choose(model, 1, fleet.views([key]), prefix=index.hits(blocks).best)
        assert decision is not None
        index.record(blocks, (key, decision.pod))
        return decision

    out: dict[str, Any] = {"pods": pods, "models": models, "index_blocks": len(index)}
    out["gateway"] = _timed(gateway, requests, repeats)
    table = table_of(8, models)
    table.prefixes = PrefixIndex(index_blocks)
    _fill(
        table.prefixes.record,
        lambda: len(table.prefixes) >= table.prefixes.max_blocks,
        range(8),
        rnd,
    )

    def router(model: str, payload: dict[str, Any]) -> object:
        blocks = prompt_blocks(table.settings.prefix, _MODEL, payload)
        decision = table.decide(_MODEL, prefix=blocks)
        assert decision is not None
        table.sent(decision.slot, blocks)
        return decision

    out["router"] = _timed(router, requests, repeats)
    out["index_bytes"] = index_bytes(index_blocks, pods)
    return out


def index_bytes(blocks: int, backends: int) -> int:
    """What a full index of ``blocks`` hashes takes (tracemalloc), prompts over ``backends``."""
    rnd = random.Random(1)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        index = PrefixIndex(blocks)
        _fill(index.record, lambda: len(index) >= blocks, range(backends), rnd)
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--decisions", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--slots", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--models", type=int, nargs="+", default=[1, 20, 50, 200])
    parser.add_argument("--prefix-decisions", type=int, default=4000)
    parser.add_argument("--prefix-index-blocks", type=int, default=DEFAULT_INDEX_BLOCKS)
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
    prefix = prefix_decision(
        args.prefix_decisions, args.repeats, index_blocks=args.prefix_index_blocks
    )
    lines += [
        "",
        f"| prefix-aware, index full ({prefix['index_blocks']:,} blocks, "
        f"{prefix['index_bytes'] / 2**20:.1f} MiB) | p50 (µs) | p99 (µs) | max (µs) |",
        "|---|---:|---:|---:|",
    ]
    for who, shape in (
        ("gateway", f"{prefix['pods']} pods x {prefix['models']} models"),
        ("router", f"8 slots x {prefix['models']} models"),
    ):
        t = prefix[who]
        lines.append(
            f"| {who}, {shape} | {t['p50_us']:.1f} | {t['p99_us']:.1f} | {t['max_us']:.1f} |"
        )
    write_result("slot_decision", {"cells": cells, "prefix": prefix, "args": vars(args)})
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
