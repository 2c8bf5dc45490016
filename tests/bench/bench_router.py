"""Router policy vs round robin: one pod of 4 one-GPU slots, one mixed request trace.

Runs the real router app (``create_router_app``: polling, optimistic records, relaying)
in front of 4 simulated workers, in process, once per policy, on the same trace:

* Each worker owns one device and serves one model at a time. A request for another model
  waits its turn to switch: the loaded model's in-flight requests drain, then the new model
  loads (15-45 s, per model; seed 004 Example 17's page-cache / NVMe cold starts).
* Serving is continuous batching: a request's time is prefill plus its output tokens times
  a decode step that grows with the batch on that engine (30 ms/token alone, +3% per
  extra running request).
* Each trace (fixed seed) mixes models of skewed popularity with short (16-128 token)
  and long (512-1024 token) generations, 20% long, arriving as a Poisson stream - seed 004
  Example 9's mix of long and short requests, with models to place as well. Two traces:
  ``fits`` (4 models, one per slot once placed) and ``tail`` (5 models, one of them rare,
  so the pod must evict now and then).

Simulated time runs ``--time-scale`` times real time (the router's poll interval is
scaled alike), and every latency is reported in simulated seconds. Exit status 1 when the
router's policy does not beat round robin on mean latency, p99 latency and model loads.

    .venv/bin/python tests/bench/bench_router.py [--scenario fits|tail] [--model-blind]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import httpx
from sie_worker.router.app import create_router_app
from sie_worker.router.policy import Decision, SlotView
from sie_worker.router.settings import RouterSettings
from sie_worker.router.state import RoutingPolicy
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

if not __package__:  # run as a script (the documented command): the repository root is not
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # on sys.path by itself
from tests.support.asgi_server import serve

SLOTS = 4
LOAD_S = {"llama-8b": 30.0, "qwen-7b": 25.0, "mistral-7b": 25.0, "gemma-9b": 45.0, "phi-4": 20.0}
SCENARIOS: dict[str, dict[str, float]] = {  # model -> share of the requests
    "fits": {"llama-8b": 0.40, "qwen-7b": 0.30, "mistral-7b": 0.20, "gemma-9b": 0.10},
    "tail": {
        "llama-8b": 0.40,
        "qwen-7b": 0.27,
        "mistral-7b": 0.17,
        "gemma-9b": 0.12,
        "phi-4": 0.04,
    },
}
STEP_S = 0.030  # decode step of one running request
BATCH_SLOWDOWN = 0.03  # extra step time per additional running request
PREFILL_S_PER_TOKEN = 0.0002


@dataclass(frozen=True)
class Job:
    arrival_s: float
    model: str
    prompt_tokens: int
    output_tokens: int


def make_trace(mix: dict[str, float], count: int, rate_per_s: float, seed: int) -> list[Job]:
    rnd = random.Random(seed)
    models, shares = list(mix), list(mix.values())
    now = 0.0
    jobs = []
    for _ in range(count):
        now += rnd.expovariate(rate_per_s)
        long = rnd.random() < 0.2
        jobs.append(
            Job(
                arrival_s=now,
                model=rnd.choices(models, shares)[0],
                prompt_tokens=rnd.randint(200, 2000),
                output_tokens=rnd.randint(512, 1024) if long else rnd.randint(16, 128),
            )
        )
    return jobs


@dataclass
class SimWorker:
    """One one-GPU worker, modelled on the real worker's manager.

    A request for a model that is not resident claims the device at once (the resident
    model shows ``unloaded``, the new one ``loading``); the old engine drains its in-flight
    requests, then the new model loads. Switches happen one at a time, in arrival order.
    """

    port: int
    scale: float
    models: tuple[str, ...]
    resident: str | None = None
    loading: bool = False
    last_used: float | None = None
    running: Counter[str] = field(default_factory=Counter)
    loads: int = 0
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    changed: anyio.Event = field(default_factory=anyio.Event)

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/readyz", self._readyz),
                Route("/v1/models", self._models),
                Route("/v1/devices", self._devices),
                Route("/v1/completions", self._complete, methods=["POST"]),
            ]
        )

    async def _readyz(self, request: Request) -> Response:
        return JSONResponse({"status": "ready"})

    async def _models(self, request: Request) -> Response:
        data = []
        for model in self.models:
            here = model == self.resident
            state = ("loading" if self.loading else "ready") if here else "unloaded"
            data.append(
                {
                    "id": model,
                    "object": "model",
                    "state": state,
                    "devices": ["cuda:0"] if here else [],
                    "width": 1,
                    "pinned": False,
                    "error": None,
                    "last_used": self.last_used if here else None,
                    "inflight": self.running[model],
                }
            )
        return JSONResponse({"object": "list", "data": data})

    async def _devices(self, request: Request) -> Response:
        return JSONResponse({"devices": [{"device": "cuda:0", "model": self.resident}]})

    async def _complete(self, request: Request) -> Response:
        body = json.loads(await request.body())
        model: str = body["model"]
        while self.resident != model or self.loading:
            if self.resident == model:
                await self._wait_change()
                continue
            async with self.lock:
                if self.resident != model:
                    await self._switch(model)
        self.running[model] += 1
        batch = sum(self.running.values())
        step = STEP_S * (1 + BATCH_SLOWDOWN * (batch - 1))
        seconds = body["prompt_tokens"] * PREFILL_S_PER_TOKEN + body["max_tokens"] * step
        try:
            await anyio.sleep(seconds * self.scale)
        finally:
            self.running[model] -= 1
            self._notify()
        self.last_used = time.time()
        return JSONResponse({"model": model, "choices": [{"text": "x"}]})

    async def _switch(self, model: str) -> None:
        old = self.resident
        self.resident, self.loading = model, True
        self.loads += 1
        self._notify()
        while old is not None and self.running[old] > 0:  # the old engine drains first
            await self._wait_change()
        await anyio.sleep(LOAD_S[model] * self.scale)
        self.loading = False
        self.last_used = time.time()
        self._notify()

    async def _wait_change(self) -> None:
        await self.changed.wait()

    def _notify(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()


def round_robin() -> RoutingPolicy:
    turns = itertools.count()

    def pick(model: str, slots: Sequence[SlotView], adapter: str | None) -> Decision | None:
        up = [s for s in slots if s.up]
        return Decision(up[next(turns) % len(up)].index, "least_outstanding") if up else None

    return pick


def least_outstanding() -> RoutingPolicy:
    def pick(model: str, slots: Sequence[SlotView], adapter: str | None) -> Decision | None:
        up = [s for s in slots if s.up]
        if not up:
            return None
        return Decision(min(up, key=lambda s: (s.outstanding, s.index)).index, "least_outstanding")

    return pick


@dataclass
class Result:
    name: str
    latencies: list[float]
    loads: int
    errors: int
    decisions: dict[str, float]
    wall_s: float

    @property
    def mean(self) -> float:
        return statistics.fmean(self.latencies)

    @property
    def p99(self) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


async def run_policy(
    name: str, policy: RoutingPolicy | None, trace: list[Job], scale: float
) -> Result:
    models = tuple(sorted({job.model for job in trace}))
    workers = [SimWorker(port=0, scale=scale, models=models) for i in range(SLOTS)]
    latencies: list[float] = []
    errors = 0
    async with contextlib.AsyncExitStack() as stack:
        # Each simulated worker on uvicorn, as the router reaches real ones: over sockets.
        for worker in workers:
            worker.port = await stack.enter_async_context(serve(worker.app(), lifespan="off"))
        settings = RouterSettings(
            worker_ports=tuple(w.port for w in workers),
            poll_interval_s=0.5 * scale,
            poll_timeout_s=2.0,
        )
        app = create_router_app(settings, policy=policy)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://router", timeout=None
            ) as client,
        ):
            await client.get("/readyz")
            start = time.monotonic()

            async def send(job: Job) -> None:
                nonlocal errors
                await anyio.sleep_until(start + job.arrival_s * scale)
                sent = time.monotonic()
                body = {
                    "model": job.model,
                    "prompt": "x",
                    "prompt_tokens": job.prompt_tokens,
                    "max_tokens": job.output_tokens,
                }
                r = await client.post("/v1/completions", json=body)
                if r.status_code != 200:
                    errors += 1
                latencies.append((time.monotonic() - sent) / scale)

            async with anyio.create_task_group() as tg:
                for job in trace:
                    tg.start_soon(send, job)
            wall = time.monotonic() - start
            metrics = (await client.get("/metrics")).text
    decisions = {
        line.split('"')[1]: float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith("sie_router_decisions_total{")
    }
    return Result(name, latencies, sum(w.loads for w in workers), errors, decisions, wall)


def table(results: list[Result]) -> str:
    lines = [
        "| policy | mean latency (s) | p99 latency (s) | model loads | errors | decisions |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for r in results:
        decided = ", ".join(f"{k} {int(v)}" for k, v in sorted(r.decisions.items()) if v)
        lines.append(
            f"| {r.name} | {r.mean:.1f} | {r.p99:.1f} | {r.loads} | {r.errors} | {decided} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--scenario", choices=[*SCENARIOS, "all"], default="all")
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--rate", type=float, default=1.0, help="arrivals per simulated second")
    parser.add_argument("--time-scale", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=8)
    parser.add_argument("--json", action="store_true", help="also print the figures as JSON")
    parser.add_argument(
        "--model-blind", action="store_true", help="also run least outstanding, model-blind"
    )
    args = parser.parse_args(argv)
    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    began = time.monotonic()
    all_win = True
    figures = []
    for scenario in names:
        trace = make_trace(SCENARIOS[scenario], args.requests, args.rate, args.seed)
        long = sum(1 for j in trace if j.output_tokens >= 512)
        print(
            f"\n### {scenario}: {len(trace)} requests over {trace[-1].arrival_s:.0f} s simulated "
            f"({args.rate}/s), {long} long, {len(SCENARIOS[scenario])} models on {SLOTS} "
            f"one-GPU slots; time scale {args.time_scale}, seed {args.seed}\n"
        )
        runs: list[tuple[str, RoutingPolicy | None]] = [("round robin", round_robin())]
        if args.model_blind:
            runs.append(("least outstanding, model-blind", least_outstanding()))
        runs.append(("router policy", None))
        results = [
            anyio.run(run_policy, name, policy, trace, args.time_scale) for name, policy in runs
        ]
        print(table(results))
        rr, ours = results[0], results[-1]
        wins = {
            "mean": ours.mean < rr.mean,
            "p99": ours.p99 < rr.p99,
            "loads": ours.loads < rr.loads,
        }
        all_win = all_win and all(wins.values())
        print(
            f"\nrouter policy vs round robin: mean {ours.mean / rr.mean:.2f}x, "
            f"p99 {ours.p99 / rr.p99:.2f}x, loads {ours.loads} vs {rr.loads} - "
            + ("wins on all three" if all(wins.values()) else f"does NOT win: {wins}")
        )
        figures += [
            {
                "scenario": scenario,
                "policy": r.name,
                "mean_s": r.mean,
                "p99_s": r.p99,
                "loads": r.loads,
                "errors": r.errors,
                "wall_s": r.wall_s,
                "decisions": r.decisions,
            }
            for r in results
        ]
    if args.json:
        print(json.dumps(figures, indent=2))
    print(f"\nwall time of the whole run: {time.monotonic() - began:.0f} s")
    return 0 if all_win else 1


if __name__ == "__main__":
    sys.exit(main())
