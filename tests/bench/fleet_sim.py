"""A simulated pool of pods, for the gateway's policy vs round robin (seed 004's workloads).

Every decision of the ``gateway`` policy is the real one (``sie_worker.gateway.policy.choose``
on the pods' simulated state: in-flight counts, models ready or loading, free slots); only
the pods are simulated, in 10 ms ticks:

* A pod has one one-GPU slot that holds one model (seed 004 Example 17: loading one takes
  ``LOAD_S``, with the model's earlier requests drained first) and serves its requests with
  continuous batching (up to 32 at once): each running request gets one token per step, and
  a step takes 30 ms alone, +3% per extra running request (Example 9's long and short mix).
* Prefill costs 0.2 ms per prompt token not already in the pod's prefix cache. A pod caches,
  per session, the longest prompt it served, and the shared 2,000-token system prompt once
  it served anything of the model; switching models clears it (Example 16).
* Sessions (agents) of one model each take turns: every prompt is the system prompt plus the
  history, which grows by 600 tokens a turn (2,400 for every third session: Example 16's
  heavy sessions); 80% of answers are short (16-128 tokens), 20% long (512-1024); the next
  turn comes an exponential 2 s after the answer. Sessions start at random in the first
  minute; models have skewed popularity.

Policies: ``gateway`` (bounded affinity: the gateway's policy with the session as its key),
``round_robin``, model-blind ``least_outstanding``, ``session_affinity`` (the session's
rendezvous-hash pod, whatever its load), and for a chat client that sends no session key:
``keyless`` (the gateway's policy, no key, no prefix index) and ``prefix_aware`` (the same
with the gateway's prefix index, real: ``sie_worker.backends.prefix``). A prompt's text is
the model's system prompt then the session's own history, one character per token.

``python -m tests.bench.fleet_sim`` prints docs/benchmarks.md's "Prefix-aware routing" tables
(:func:`prefix_tables`): seed 004 Example 16 turn by turn (:mod:`tests.bench.fleet_sim_turns`),
then this fleet's.
"""

from __future__ import annotations

import heapq
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sie_worker.backends.prefix import DEFAULT_INDEX_BLOCKS, PrefixIndex, block_hashes
from sie_worker.backends.session import rendezvous_order
from sie_worker.gateway.policy import GroupView, PodView, choose

from tests.bench.fleet_sim_turns import EX16_POLICIES, simulate_turns

__all__ = ["POLICIES", "SimResult", "Workload", "prefix_tables", "simulate"]

STEP_S = 0.030
TICK_S = 0.01  # the simulation's clock step
BATCH_SLOWDOWN = 0.03
MAX_BATCH = 32
PREFILL_S_PER_TOKEN = 0.0002
LOAD_S = 20.0
SYSTEM_TOKENS = 2000


@dataclass(frozen=True)
class Workload:
    pods: int = 8
    sessions: int = 96
    turns: int = 10
    models: tuple[tuple[str, float], ...] = (
        ("llama-8b", 0.35),
        ("qwen-7b", 0.25),
        ("mistral-7b", 0.15),
        ("gemma-9b", 0.10),
        ("phi-4", 0.10),
        ("granite-8b", 0.05),
    )
    think_s: float = 2.0
    start_window_s: float = 60.0
    seed: int = 4


@dataclass
class _Request:
    session: int
    model: str
    prompt: int
    output: int
    arrival: float
    started: float | None = None  # decode start (after prefill)
    produced: float = 0.0
    finish: float | None = None


@dataclass
class _Pod:
    name: str
    model: str | None = None
    loading_until: float | None = None  # loading `model` until then
    queue: list[_Request] = field(default_factory=list)  # waiting for this pod
    running: list[_Request] = field(default_factory=list)
    cache: dict[int, int] = field(default_factory=dict)  # session -> cached prompt tokens
    warm: bool = False  # the system prompt is cached
    prefill_until: float = 0.0
    loads: int = 0
    computed: int = 0  # prefill tokens it computed: its load, as seed 004 Example 16 counts

    @property
    def outstanding(self) -> int:
        return len(self.queue) + len(self.running)

    def view(self) -> PodView:
        models: dict[str, str] = {}
        if self.model is not None:
            models[self.model] = "loading" if self.loading_until is not None else "ready"
        free = 1 if self.model is None and not self.queue else 0
        return PodView(self.name, True, 1, self.outstanding, models, free)


@dataclass(frozen=True)
class SimResult:
    policy: str
    requests: int
    mean_s: float
    p50_s: float
    p99_s: float
    loads: int
    hit_rate: float
    prefill_tokens: int
    max_load: int = 0  # the most prefill tokens one pod computed


Policy = Callable[[_Request, Sequence[_Pod], int], int]
_BLOCK_CHARS = 64


def _decide(request: _Request, pods: Sequence[_Pod], **kw: Any) -> int:
    group = GroupView("pool", 0, [p.view() for p in pods])
    decision = choose(request.model, 1, [group], **kw)
    assert decision is not None
    return next(i for i, p in enumerate(pods) if p.name == decision.pod)


def _gateway(request: _Request, pods: Sequence[_Pod], _: int) -> int:
    return _decide(request, pods, session=f"s{request.session}")


def _keyless(request: _Request, pods: Sequence[_Pod], _: int) -> int:
    return _decide(request, pods)


def _round_robin(request: _Request, pods: Sequence[_Pod], counter: int) -> int:
    return counter % len(pods)


def _least_outstanding(request: _Request, pods: Sequence[_Pod], _: int) -> int:
    return min(range(len(pods)), key=lambda i: (pods[i].outstanding, i))


def _session_affinity(request: _Request, pods: Sequence[_Pod], _: int) -> int:
    home = rendezvous_order(f"s{request.session}", [p.name for p in pods])[0]
    return next(i for i, p in enumerate(pods) if p.name == home)


def _prefix_aware() -> Policy:
    index = PrefixIndex(DEFAULT_INDEX_BLOCKS)

    def pick(request: _Request, pods: Sequence[_Pod], _: int) -> int:
        blocks = block_hashes(request.model, prompt_of(request), _BLOCK_CHARS)
        chosen = _decide(request, pods, prefix=index.hits(blocks).best)
        index.record(blocks, ("pool", pods[chosen].name))
        return chosen

    return pick


def prompt_of(request: _Request) -> str:
    """The request's prompt text: its model's system prompt, then its session's history."""
    mark = chr(0x100 + request.session)
    history = request.prompt - SYSTEM_TOKENS
    return f"{request.model}:".ljust(SYSTEM_TOKENS, "S") + mark * history


# Each run gets its own policy (prefix_aware keeps an index).
POLICIES: dict[str, Callable[[], Policy]] = {
    "gateway": lambda: _gateway,
    "round_robin": lambda: _round_robin,
    "least_outstanding": lambda: _least_outstanding,
    "session_affinity": lambda: _session_affinity,
    "keyless": lambda: _keyless,
    "prefix_aware": _prefix_aware,
}


def simulate(policy: str, workload: Workload) -> SimResult:
    rnd = random.Random(workload.seed)  # the same sessions, turns and lengths for every policy
    names, weights = zip(*workload.models, strict=True)
    session_model = rnd.choices(names, weights, k=workload.sessions)
    lengths = [
        [rnd.randint(512, 1024) if rnd.random() < 0.2 else rnd.randint(16, 128)
         for _ in range(workload.turns)]
        for _ in range(workload.sessions)
    ]  # fmt: skip
    thinks = [[rnd.expovariate(1 / workload.think_s) for _ in range(workload.turns)]
              for _ in range(workload.sessions)]  # fmt: skip
    arrivals = [(rnd.uniform(0, workload.start_window_s), s) for s in range(workload.sessions)]
    heapq.heapify(arrivals)
    turn = [0] * workload.sessions
    pods = [_Pod(f"pod-{i}") for i in range(workload.pods)]
    pick = POLICIES[policy]()
    done: list[_Request] = []
    counter = reused = computed = 0
    now = 0.0
    total = workload.sessions * workload.turns
    while len(done) < total:
        # Arrivals: each session's next turn, a think time after its last answer.
        while arrivals and arrivals[0][0] <= now:
            _, s = heapq.heappop(arrivals)
            growth = 2400 if s % 3 == 0 else 600
            prompt = SYSTEM_TOKENS + growth * (turn[s] + 1)
            req = _Request(s, session_model[s], prompt, lengths[s][turn[s]], now)
            pods[pick(req, pods, counter)].queue.append(req)
            counter += 1
        for pod in pods:
            # Loads end; a pod whose queue head wants another model switches once drained.
            if pod.loading_until is not None and pod.loading_until <= now:
                pod.loading_until = None
            if pod.loading_until is None and pod.queue and not pod.running:
                head = pod.queue[0]
                if head.model != pod.model:
                    pod.model, pod.loading_until = head.model, now + LOAD_S
                    pod.cache.clear()
                    pod.warm = False
                    pod.loads += 1
            if pod.loading_until is not None:
                continue
            # Queued requests for the loaded model join the batch (continuous batching).
            for req in [r for r in pod.queue if r.model == pod.model]:
                if len(pod.running) >= MAX_BATCH:
                    break
                hit = min(pod.cache.get(req.session, SYSTEM_TOKENS if pod.warm else 0), req.prompt)
                reused += hit
                computed += req.prompt - hit
                pod.computed += req.prompt - hit
                start = max(pod.prefill_until, now)
                pod.prefill_until = start + (req.prompt - hit) * PREFILL_S_PER_TOKEN
                req.started = pod.prefill_until
                pod.cache[req.session] = req.prompt
                pod.warm = True
                pod.queue.remove(req)
                pod.running.append(req)
            active = [r for r in pod.running if r.started is not None and r.started <= now]
            if active:
                step_time = STEP_S * (1 + BATCH_SLOWDOWN * (len(active) - 1))
                for req in active:
                    req.produced += TICK_S / step_time
            for req in [r for r in active if r.produced >= r.output]:
                req.finish = now
                pod.running.remove(req)
                done.append(req)
                turn[req.session] += 1
                if turn[req.session] < workload.turns:
                    think = thinks[req.session][turn[req.session]]
                    heapq.heappush(arrivals, (now + think, req.session))
        now += TICK_S
    latencies = sorted((r.finish or 0.0) - r.arrival for r in done)
    return SimResult(
        policy=policy,
        requests=len(done),
        mean_s=statistics.fmean(latencies),
        p50_s=latencies[len(latencies) // 2],
        p99_s=latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
        loads=sum(p.loads for p in pods),
        hit_rate=reused / max(1, reused + computed),
        prefill_tokens=computed,
        max_load=max(p.computed for p in pods),
    )


# -- the tables of docs/benchmarks.md ("Prefix-aware routing") ----------------------------


def prefix_tables(workload: Workload | None = None) -> str:
    """Markdown: Example 16's five policies, then the timed fleet's, side by side."""
    lines = [
        "| policy | hit rate | computed tokens | max replica load | work per replica |",
        "|---|---:|---:|---:|---|",
    ]
    for policy in EX16_POLICIES:
        t = simulate_turns(policy)
        work = ", ".join(f"{w:,}" for w in t.work)
        lines.append(f"| {policy} | {t.hit_rate:.1%} | {t.computed:,} | {t.max_load:,} | {work} |")
    w = workload or Workload()
    lines += [
        "",
        f"{w.pods} one-slot pods, {w.sessions} chat sessions x {w.turns} turns over "
        f"{len(w.models)} models (seed {w.seed}); `keyless` and `prefix_aware` get no session key.",
        "",
        "| policy | session key | hit rate | computed tokens | max replica load "
        "| model loads | mean (s) | p99 (s) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    names = {"gateway": "bounded_affinity (gateway)", "least_outstanding": "least_load"}
    for policy in POLICIES:
        r = simulate(policy, w)
        keyed = "yes" if policy in ("gateway", "session_affinity") else "no"
        lines.append(
            f"| {names.get(policy, policy)} | {keyed} | {r.hit_rate:.1%} | "
            f"{r.prefill_tokens:,} | {r.max_load:,} | {r.loads} | {r.mean_s:.1f} | {r.p99_s:.1f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(prefix_tables())
