"""Seed 004 Example 16 (prefix-aware routing), turn by turn: the first table of
docs/benchmarks.md's "Prefix-aware routing" (:func:`tests.bench.fleet_sim.prefix_tables`).

Example 16's own model, without time: 6 agent sessions take 5 turns each, in order, on 4
replicas; a prompt is the 2,000-token system prompt plus the session's history, which
grows by 2,400 tokens a turn for sessions 0 and 4 and by 600 for the others. A replica
reuses the longest prompt it cached for the session, else the system prompt once it served
anything; its load is the prefill tokens it computed. The first four policies are the
seed's (its table: hit rate 56.7% / 38.1% / 73.8% / 57.7%, busiest replica 28,400 /
30,800 / 26,000 / 21,200); ``prefix_aware`` is the routers' rule with no session key: the
replica the prefix index (sie_worker.backends.prefix, real) finds holding the longest
prefix of the prompt (ties: the most recent), within the same 1.25 x mean bound as
``bounded_affinity``, else the least loaded.
"""

from __future__ import annotations

from dataclasses import dataclass

from sie_worker.backends.prefix import PrefixIndex, block_hashes

__all__ = ["EX16_POLICIES", "TurnResult", "ex16_prompt", "simulate_turns"]

EX16_SYSTEM = 2000
EX16_GROWTH = (2400, 600, 600, 600, 2400, 600)
EX16_TURNS = 4 + 1
EX16_REPLICAS = 4
EX16_POLICIES = (
    "round_robin",
    "least_load",
    "session_affinity",
    "bounded_affinity",
    "prefix_aware",
)


@dataclass(frozen=True)
class TurnResult:
    policy: str
    computed: int
    reused: int
    work: tuple[int, ...]  # prefill tokens computed per replica

    @property
    def hit_rate(self) -> float:
        return self.reused / (self.computed + self.reused)

    @property
    def max_load(self) -> int:
        return max(self.work)


def ex16_prompt(session: int, turn: int) -> str:
    """Session ``session``'s prompt at ``turn`` (1-based), one character per token: the
    shared system prompt, then its own history (a prefix of every later turn's)."""
    history = EX16_GROWTH[session % len(EX16_GROWTH)] * turn
    mark = chr(ord("a") + session % 26)
    return "S" * EX16_SYSTEM + (mark * 63 + "|") * (history // 64) + mark * (history % 64)


def simulate_turns(
    policy: str,
    *,
    sessions: int = len(EX16_GROWTH),
    turns: int = EX16_TURNS,
    replicas: int = EX16_REPLICAS,
    block_chars: int = 16,
) -> TurnResult:
    """Example 16's program, with ``prefix_aware`` beside its four policies."""
    cached: list[dict[int, int]] = [{} for _ in range(replicas)]
    work = [0] * replicas
    index = PrefixIndex(1 << 20)
    computed = reused = request = 0

    def least_loaded() -> int:
        return min(range(replicas), key=lambda r: (work[r], r))

    def within_bound(r: int) -> bool:
        return work[r] <= 1.25 * (sum(work) // replicas)  # the seed's integer mean

    for turn in range(1, turns + 1):
        for s in range(sessions):
            prompt = ex16_prompt(s, turn)
            blocks = block_hashes("m", prompt, block_chars)
            if policy == "round_robin":
                r = request % replicas
            elif policy == "least_load":
                r = least_loaded()
            elif policy == "session_affinity":
                r = s % replicas
            elif policy == "bounded_affinity":
                r = s % replicas if within_bound(s % replicas) else least_loaded()
            elif policy == "prefix_aware":
                found = index.match(blocks)
                best = max(found, key=lambda b: (found[b].blocks, found[b].seq), default=None)
                r = best if isinstance(best, int) and within_bound(best) else least_loaded()
            else:
                raise ValueError(f"unknown policy {policy!r}; use one of {EX16_POLICIES}")
            request += 1
            index.record(blocks, r)
            hit = cached[r].get(s, EX16_SYSTEM if cached[r] else 0)
            reused += hit
            computed += len(prompt) - hit
            work[r] += len(prompt) - hit
            cached[r][s] = len(prompt)
    return TurnResult(policy, computed, reused, tuple(work))
