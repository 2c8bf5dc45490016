"""The fleet simulation: seed 004 Example 16 reproduced, and prefix-aware routing beside the
policies it reports, with and without session keys."""

from __future__ import annotations

import pytest

from tests.bench.fleet_sim import Workload, prefix_tables, simulate
from tests.bench.fleet_sim_turns import EX16_POLICIES, ex16_prompt, simulate_turns

# Example 16's printed table (seed 004): computed, reused, work per replica.
SEED_TABLE = {
    "round_robin": (72800, 95200, (28400, 10400, 24200, 9800)),
    "least_load": (104000, 64000, (25400, 24800, 30800, 23000)),
    "session_affinity": (44000, 124000, (26000, 8000, 5000, 5000)),
    "bounded_affinity": (71000, 97000, (21200, 17600, 15200, 17000)),
}


@pytest.mark.parametrize("policy", sorted(SEED_TABLE))
def test_example_16_reproduces_the_seeds_figures(policy: str) -> None:
    result = simulate_turns(policy)
    assert (result.computed, result.reused, result.work) == SEED_TABLE[policy]


def test_bounded_affinity_has_the_lowest_maximum_load_of_the_seeds_four_at_57_7_percent() -> None:
    results = {p: simulate_turns(p) for p in SEED_TABLE}
    bounded = results["bounded_affinity"]
    assert round(bounded.hit_rate * 100, 1) == 57.7
    assert round(results["least_load"].hit_rate * 100, 1) == 38.1
    assert bounded.max_load == min(r.max_load for r in results.values())


def test_prefix_aware_without_keys_reuses_more_than_bounded_affinity_at_no_higher_load() -> None:
    prefix, bounded = simulate_turns("prefix_aware"), simulate_turns("bounded_affinity")
    assert prefix.hit_rate > bounded.hit_rate
    assert prefix.max_load <= bounded.max_load


def test_an_example_16_prompt_is_a_prefix_of_the_sessions_next_turn() -> None:
    for session in range(6):
        assert ex16_prompt(session, 2).startswith(ex16_prompt(session, 1))
        assert len(ex16_prompt(session, 3)) == 2000 + (2400 if session in (0, 4) else 600) * 3
    assert ex16_prompt(0, 1)[:2000] == ex16_prompt(1, 1)[:2000]  # the shared system prompt
    assert ex16_prompt(0, 1)[2000] != ex16_prompt(1, 1)[2000]


def test_on_the_keyless_chat_workload_prefix_aware_beats_keyed_bounded_affinity() -> None:
    workload = Workload()
    prefix, keyless = simulate("prefix_aware", workload), simulate("keyless", workload)
    bounded = simulate("gateway", workload)  # the same sessions, sent with their keys
    assert prefix.requests == bounded.requests == workload.sessions * workload.turns
    assert prefix.hit_rate > bounded.hit_rate > keyless.hit_rate
    assert prefix.max_load <= bounded.max_load


def test_the_tables_have_a_row_per_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    small = Workload(pods=2, sessions=4, turns=2)
    text = prefix_tables(small)
    for policy in (*EX16_POLICIES, "keyless", "bounded_affinity (gateway)"):
        assert f"| {policy} |" in text
