"""The gateway's routing decision (pure): tiers, the load bound, session affinity, groups."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace
from functools import partial

from hypothesis import given
from hypothesis import strategies as st

from sie_worker.backends.bound import load_cap, within_bound
from sie_worker.backends.prefix import PrefixMatch, best_of
from sie_worker.backends.session import rendezvous_order
from sie_worker.gateway.policy import Decision, GroupView, PodLike, PodView, choose
from sie_worker.gateway.tiers import tier_of

MODELS = ("m", "n", "o")


def fits(pod: PodLike, cap: int, slot_target: int) -> bool:
    """The load-bound filter as the policy applies it to a pod."""
    return within_bound(pod.outstanding, cap, slots=pod.slots, slot_target=slot_target)


STATES = ("unloaded", "loading", "ready", "failed")


def pod(
    name: str,
    *,
    outstanding: int = 0,
    free_run: int = 0,
    up: bool = True,
    slots: int = 1,
    slot_width: int = 8,
    **models: str,
) -> PodView:
    return PodView(name, up, slots, outstanding, dict(models), free_run, slot_width)


def group(*pods: PodView, key: str = "g", order: int = 0) -> GroupView:
    return GroupView(key, order, list(pods))


pods_strategy = st.lists(
    st.builds(
        PodView,
        name=st.sampled_from([f"p{i}" for i in range(8)]),
        up=st.booleans(),
        slots=st.integers(1, 4),
        outstanding=st.integers(0, 20),
        models=st.dictionaries(st.sampled_from(MODELS), st.sampled_from(STATES), max_size=3),
        free_run=st.integers(0, 4),
        slot_width=st.integers(1, 4),
    ),
    max_size=8,
    unique_by=lambda p: p.name,
)
groups_strategy = st.lists(pods_strategy, min_size=1, max_size=3).map(
    lambda lists: [GroupView(f"g{i}", i, pods) for i, pods in enumerate(lists)]
)
sessions = st.none() | st.text(min_size=1, max_size=8)


def _candidates(g: GroupView, exclude: Sequence[str] = (), width: int = 1) -> list[PodView]:
    return [
        p  # type: ignore[misc]
        for p in g.pods
        if p.up and p.name not in exclude and p.slot_width >= width
    ]


# -- properties -----------------------------------------------------------------------------


@given(groups_strategy, st.sampled_from(MODELS), st.integers(1, 4), sessions, st.integers(1, 8))
def test_a_decision_exists_exactly_when_some_pod_answers_with_slots_wide_enough(
    groups: list[GroupView], model: str, width: int, session: str | None, target: int
) -> None:
    decision = choose(model, width, groups, session=session, slot_target=target)
    assert (decision is None) == all(not _candidates(g, width=width) for g in groups)


@given(groups_strategy, st.sampled_from(MODELS), st.integers(1, 4), sessions, st.integers(1, 8))
def test_the_chosen_pod_answers_fits_the_bound_and_has_the_best_fitting_tier(
    groups: list[GroupView], model: str, width: int, session: str | None, target: int
) -> None:
    decision = choose(model, width, groups, session=session, slot_target=target)
    if decision is None:
        return
    chosen_group = next(g for g in groups if g.key == decision.group)
    candidates = _candidates(chosen_group, width=width)
    chosen = next(p for p in candidates if p.name == decision.pod)
    cap = load_cap(sum(p.outstanding for p in candidates), len(candidates))
    assert fits(chosen, cap, target)
    best = min(tier_of(p, model, width) for p in candidates if fits(p, cap, target))
    assert tier_of(chosen, model, width) == best
    if session is None:
        same = [p for p in candidates if tier_of(p, model, width) == best and fits(p, cap, target)]
        assert chosen.outstanding == min(p.outstanding for p in same)
        assert decision.reason == ("ready", "loading", "free_slot", "least_outstanding")[best]
    else:
        assert decision.reason in ("affinity", "affinity_spill")


@given(groups_strategy, st.sampled_from(MODELS), st.integers(1, 4), sessions, st.randoms())
def test_the_decision_does_not_depend_on_the_order_of_the_input(
    groups: list[GroupView], model: str, width: int, session: str | None, rnd: random.Random
) -> None:
    shuffled = [GroupView(g.key, g.order, rnd.sample(list(g.pods), len(g.pods))) for g in groups]
    rnd.shuffle(shuffled)
    assert choose(model, width, shuffled, session=session) == choose(
        model, width, groups, session=session
    )


@given(groups_strategy, st.sampled_from(MODELS), st.integers(0, 20))
def test_the_least_loaded_candidate_always_fits(
    groups: list[GroupView], model: str, extra: int
) -> None:
    for g in groups:
        candidates = _candidates(g)
        if not candidates:
            continue
        cap = load_cap(sum(p.outstanding for p in candidates), len(candidates))
        assert fits(min(candidates, key=lambda p: p.outstanding), cap, slot_target=1)


@given(pods_strategy, st.sampled_from(MODELS), st.text(min_size=1, max_size=8), st.data())
def test_a_session_keeps_its_pod_when_another_pod_leaves(
    pods: list[PodView], model: str, session: str, data: st.DataObject
) -> None:
    """Consistent hashing: without load pressure, only the sessions of a leaving pod move."""
    live = [p for p in pods if p.up]
    before = choose(model, 1, [group(*live)], session=session, slot_target=1000)
    if before is None or len(live) < 2:
        return
    leaving = data.draw(st.sampled_from([p for p in live if p.name != before.pod]))
    same_tier = [p for p in live if tier_of(p, model, 1) == tier_of(leaving, model, 1)]
    if len(same_tier) == 1 and tier_of(leaving, model, 1) < tier_of(
        next(p for p in live if p.name == before.pod), model, 1
    ):
        return  # the leaving pod was the only better one: nothing to keep
    after = choose(
        model,
        1,
        [group(*[p for p in live if p is not leaving])],
        session=session,
        slot_target=1000,
    )
    assert after is not None
    assert after.pod == before.pod


@given(
    st.lists(st.text(min_size=1, max_size=6), min_size=1, max_size=10, unique=True),
    st.text(max_size=8),
)
def test_rendezvous_order_is_a_permutation_stable_under_removal(names: list[str], key: str) -> None:
    order = rendezvous_order(key, names)
    assert sorted(order) == sorted(names)
    gone = order[-1]
    assert rendezvous_order(key, [n for n in names if n != gone]) == order[:-1]


# -- examples -------------------------------------------------------------------------------


def test_ready_beats_loading_beats_free_slot_beats_the_rest() -> None:
    pods = [
        pod("a", outstanding=0),
        pod("b", free_run=1),
        pod("c", m="loading", outstanding=2),
        pod("d", m="ready", outstanding=3),
    ]
    assert choose("m", 1, [group(*pods)]) == Decision("g", "d", "ready")
    assert choose("m", 1, [group(*pods[:3])]) == Decision("g", "c", "loading")
    assert choose("m", 1, [group(*pods[:2])]) == Decision("g", "b", "free_slot")
    assert choose("m", 1, [group(pods[0], pod("e", outstanding=1))]) == Decision(
        "g", "a", "least_outstanding"
    )


def test_a_free_run_narrower_than_the_model_is_no_free_slot() -> None:
    pods = [pod("a", free_run=1, outstanding=1), pod("b", free_run=2, outstanding=2)]
    assert choose("m", 2, [group(*pods)]) == Decision("g", "b", "free_slot")


def test_a_pod_whose_slots_are_narrower_than_the_model_is_never_a_candidate() -> None:
    # It lists the model (every worker lists every config) and is idle: still not a pod
    # that can hold a width-2 model, so the request waits for one that can.
    narrow = pod("a", slot_width=1, free_run=1, m="unloaded")
    assert choose("m", 2, [group(narrow)]) is None
    assert choose("m", 2, [group(narrow, pod("b", slot_width=4, outstanding=9))]) == Decision(
        "g", "b", "least_outstanding"
    )
    assert choose("m", 1, [group(narrow)]) == Decision("g", "a", "free_slot")


def test_a_busy_pod_with_the_model_spills_to_an_idle_pod_once_over_the_bound() -> None:
    # 4 per slot carry freely; beyond, ceil(1.25 x (total + 1) / n) bounds a pod.
    busy = pod("a", m="ready", outstanding=4)
    idle = [pod(n, free_run=1) for n in "bcd"]
    # 4 + 1 > ceil(1.25 x 5 / 4) = 2 and 4 is not below 1 slot x 4: spill.
    assert choose("m", 1, [group(busy, *idle)]) == Decision("g", "b", "free_slot")
    # Below its slots x slot_target it stays, however idle the others are.
    assert choose("m", 1, [group(pod("a", m="ready", outstanding=3), *idle)]).pod == "a"  # type: ignore[union-attr]
    # A pod that is down or excluded is never chosen.
    assert choose("m", 1, [group(busy)], exclude={"a"}) is None
    assert choose("m", 1, [group(pod("a", m="ready", up=False))]) is None


def test_seed_004_affinity_with_bounded_load_moves_a_session_off_an_overloaded_home() -> None:
    names = ["r0", "r1", "r2", "r3"]
    home = rendezvous_order("session-0", names)[0]
    light = [pod(n, outstanding=1) for n in names]
    assert choose("m", 1, [group(*light)], session="session-0", slot_target=1) == Decision(
        "g", home, "affinity"
    )
    # Home at 6 while the rest carry 1: ceil(1.25 x 10 / 4) = 4 < 7, so it moves.
    heavy = [pod(n, outstanding=6 if n == home else 1) for n in names]
    moved = choose("m", 1, [group(*heavy)], session="session-0", slot_target=1)
    assert moved is not None
    assert moved.pod != home
    assert moved.reason == "affinity_spill"


def test_sessions_spread_over_pods_and_each_keeps_its_own() -> None:
    pods = [pod(f"p{i}", m="ready") for i in range(4)]
    homes = {choose("m", 1, [group(*pods)], session=f"s{i}").pod for i in range(64)}  # type: ignore[union-attr]
    assert homes == {"p0", "p1", "p2", "p3"}
    assert len({choose("m", 1, [group(*pods)], session="s1") for _ in range(5)}) == 1


def test_the_group_with_the_model_ready_wins_then_the_less_loaded_then_file_order() -> None:
    first = group(pod("a", free_run=1), key="first", order=0)
    second = group(pod("b", m="ready", outstanding=2), key="second", order=1)
    assert choose("m", 1, [first, second]) == Decision("second", "b", "ready")
    busy = group(pod("c", free_run=1, outstanding=3), key="busy", order=0)
    quiet = group(pod("d", free_run=1), key="quiet", order=1)
    assert choose("m", 1, [busy, quiet]).group == "quiet"  # type: ignore[union-attr]
    assert (
        choose("m", 1, [quiet, group(pod("e", free_run=1), key="later", order=2)]).group == "quiet"
    )  # type: ignore[union-attr]
    # A group without a candidate is passed over; all without: None (hold).
    empty = group(pod("f", up=False), key="empty", order=0)
    assert choose("m", 1, [empty, quiet]).group == "quiet"  # type: ignore[union-attr]
    assert choose("m", 1, [empty, group(key="none", order=1)]) is None


prefixes_strategy = st.dictionaries(
    st.tuples(st.sampled_from(["g0", "g1", "g2"]), st.sampled_from([f"p{i}" for i in range(8)])),
    st.builds(PrefixMatch, st.integers(1, 6), st.integers(1, 9)),
    max_size=10,
)


@given(groups_strategy, st.sampled_from(MODELS), prefixes_strategy, st.integers(1, 8))
def test_without_a_session_the_longest_cached_prefix_within_the_bound_wins(
    groups: list[GroupView], model: str, cached: dict[tuple[str, str], PrefixMatch], target: int
) -> None:
    decision = choose(model, 1, groups, slot_target=target, prefix=partial(best_of, cached))
    plain = choose(model, 1, groups, slot_target=target)
    eligible = []
    for g in groups:
        candidates = _candidates(g)
        cap = load_cap(sum(p.outstanding for p in candidates), len(candidates) or 1)
        for p in candidates:
            found = cached.get((str(g.key), p.name))
            if found and fits(p, cap, target) and tier_of(p, model, 1) <= 1:
                eligible.append((found.blocks, found.seq, g.key, p.name))
    if not eligible:
        assert decision == plain  # no match within the bound: the usual order
        return
    assert decision is not None
    assert decision.reason == "prefix"
    longest = max(b for b, *_ in eligible)
    newest = max(s for b, s, *_ in eligible if b == longest)
    assert (decision.group, decision.pod) in [
        (k, n) for b, s, k, n in eligible if (b, s) == (longest, newest)
    ]


def test_a_session_key_wins_over_a_cached_prefix() -> None:
    groups = [group(pod("a", m="ready"), pod("b", m="ready"), key="g")]
    cached = {("g", "a"): PrefixMatch(3, 1), ("g", "b"): PrefixMatch(1, 2)}
    assert choose("m", 1, groups, prefix=partial(best_of, cached)) == Decision("g", "a", "prefix")
    assert choose("m", 1, groups, session="s", prefix=partial(best_of, cached)).reason in (
        "affinity",
        "affinity_spill",
    )


def test_a_prefix_on_a_pod_over_the_bound_or_without_the_model_gives_way() -> None:
    busy = [group(pod("a", outstanding=9, m="ready"), pod("b", m="ready"), key="g")]
    cached = {("g", "a"): PrefixMatch(5, 1)}
    assert choose("m", 1, busy, slot_target=1, prefix=partial(best_of, cached)) == Decision(
        "g", "b", "ready"
    )
    evicted = [group(pod("a", free_run=1), pod("b", m="ready"), key="g")]
    assert choose("m", 1, evicted, prefix=partial(best_of, cached)) == Decision("g", "b", "ready")
    # Two pods with the same prefix: the one that was sent it last.
    both = [group(pod("a", m="ready"), pod("b", m="ready"), key="g")]
    tie = {("g", "a"): PrefixMatch(2, 4), ("g", "b"): PrefixMatch(2, 7)}
    assert choose("m", 1, both, prefix=partial(best_of, tie)) == Decision("g", "b", "prefix")


# -- LoRA affinity ------------------------------------------------------------------------

ADAPTERS = ("x", "y")


@st.composite
def groups_with_adapters(draw: st.DrawFn) -> list[GroupView]:
    served = st.frozensets(st.sampled_from(ADAPTERS))
    return [
        GroupView(
            g.key,
            g.order,
            [
                replace(p, adapters={m: draw(served) for m in p.models})  # type: ignore[type-var]
                for p in g.pods
            ],
        )
        for g in draw(groups_strategy)
    ]


@given(
    groups_with_adapters(),
    st.sampled_from(MODELS),
    st.integers(1, 4),
    st.sampled_from(ADAPTERS),
    st.integers(1, 8),
)
def test_an_adapter_picks_within_the_best_tier_its_serving_pods_first(
    groups: list[GroupView], model: str, width: int, adapter: str, target: int
) -> None:
    plain = choose(model, width, groups, slot_target=target)
    decision = choose(model, width, groups, slot_target=target, adapter=adapter)
    if plain is None:
        assert decision is None
        return
    assert decision is not None
    # The adapter never changes the group or the tier, only the pod within them.
    assert (decision.group, decision.reason) == (plain.group, plain.reason)
    chosen_group = next(g for g in groups if g.key == decision.group)
    candidates = _candidates(chosen_group, width=width)
    cap = load_cap(sum(p.outstanding for p in candidates), len(candidates))
    tier = tier_of(next(p for p in candidates if p.name == decision.pod), model, width)
    same = [p for p in candidates if tier_of(p, model, width) == tier and fits(p, cap, target)]
    serving = [p for p in same if adapter in p.adapters.get(model, ())]
    chosen = next(p for p in same if p.name == decision.pod)
    if serving:
        assert chosen in serving
        assert chosen.outstanding == min(p.outstanding for p in serving)
    else:
        assert decision == plain


def test_a_session_keeps_its_pod_whatever_adapter_it_asks_for() -> None:
    pods = [pod(f"p{i}", m="ready") for i in range(4)]
    served = [
        replace(p, adapters={"m": frozenset({"x"})}) if i == 3 else p for i, p in enumerate(pods)
    ]
    home = choose("m", 1, [group(*pods)], session="s")
    assert choose("m", 1, [group(*served)], session="s", adapter="x") == home


def test_an_idle_pod_without_the_adapter_gives_way_to_a_busier_one_with_it() -> None:
    pods = [
        pod("a", m="ready"),
        replace(pod("b", m="ready", outstanding=2), adapters={"m": frozenset({"x"})}),
    ]
    assert choose("m", 1, [group(*pods)]) == Decision("g", "a", "ready")
    assert choose("m", 1, [group(*pods)], adapter="x") == Decision("g", "b", "ready")
