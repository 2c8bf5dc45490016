from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from sie_worker.worker.placement.allocator import (
    STRATEGIES,
    Claim,
    NoPlacement,
    Placement,
    Strategy,
    place,
)

GIB = 2**30
BUDGET = 76 * GIB  # 80 GiB at the default 95% threshold


def _one(model: str, device: int, memory: int | None = 33 * GIB, **kwargs: object) -> Claim:
    return Claim(model, device, 1, memory=memory, **kwargs)  # type: ignore[arg-type]


# --- memory unknown: one model per device, as before --------------------------------------


def test_empty_worker_takes_the_first_block() -> None:
    assert place(4, [], 2) == Placement(0, 2)


def test_first_free_block_in_list_order_is_taken() -> None:
    claims = [Claim("a", 0, 1)]
    assert place(4, claims, 2) == Placement(1, 2)


def test_block_must_be_contiguous() -> None:
    # Free devices 1 and 3 are not contiguous: a width-2 model must evict.
    claims = [Claim("a", 0, 1, last_used=5), Claim("b", 2, 1, last_used=1)]
    placement = place(4, claims, 2)
    assert placement.evict == ("b",)
    assert placement.start in (1, 2)
    assert set(placement.indices) >= {2}


def test_width_above_device_count_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        place(2, [], 4)


def test_unknown_strategy_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="strategy"):
        place(2, [], 1, strategy="scatter")  # type: ignore[arg-type]


def test_unknown_memory_keeps_one_model_per_device() -> None:
    assert place(2, [Claim("a", 0, 1)], 1) == Placement(1, 1)
    assert place([None, None], [Claim("a", 0, 1, memory=GIB)], 1, need=GIB) == Placement(1, 1)


def test_two_models_on_a_device_of_unknown_memory_are_rejected() -> None:
    with pytest.raises(ValueError, match="claimed twice"):
        place(2, [Claim("a", 0, 1), Claim("b", 0, 1)], 1)


def test_group_load_skips_blocks_with_pinned_models() -> None:
    claims = [
        Claim("pinned", 0, 2, pinned=True, last_used=0),
        Claim("recent", 2, 2, last_used=100),
    ]
    assert place(4, claims, 2) == Placement(2, 2, ("recent",))


def test_fewest_evictions_beats_idle_time() -> None:
    claims = [
        Claim("a", 0, 1, last_used=1),
        Claim("b", 1, 1, last_used=2),
        Claim("group", 2, 2, last_used=50),
    ]
    # Block 0-1 needs two evictions, block 2-3 one: the group goes although used recently.
    assert place(4, claims, 2) == Placement(2, 2, ("group",))


def test_tie_goes_to_block_whose_most_recent_model_idled_longest() -> None:
    claims = [
        Claim("a", 0, 1, last_used=10),
        Claim("b", 1, 1, last_used=1),
        Claim("c", 2, 1, last_used=2),
        Claim("d", 3, 1, last_used=3),
    ]
    # Width 2: blocks 0-1 (max 10), 1-2 (max 2), 2-3 (max 3): every block needs 2 evictions.
    assert place(4, claims, 2) == Placement(1, 2, ("b", "c"))


def test_single_device_load_on_a_full_worker_evicts_lru_group() -> None:
    claims = [
        Claim("group-old", 0, 2, last_used=1),
        Claim("group-new", 2, 2, last_used=9),
    ]
    assert place(4, claims, 1) == Placement(0, 1, ("group-old",))


def test_single_device_load_evicts_a_single_device_model_before_an_older_group() -> None:
    claims = [Claim("group", 0, 2, last_used=1), Claim("a", 2, 1, last_used=5)]
    assert place(3, claims, 1) == Placement(2, 1, ("a",))


def test_loading_models_are_never_evicted() -> None:
    claims = [Claim("loading", 0, 2, evictable=False), Claim("ready", 2, 2, last_used=99)]
    assert place(4, claims, 2).evict == ("ready",)


def test_no_block_can_be_freed_names_the_holders() -> None:
    claims = [Claim("p1", 0, 1, pinned=True), Claim("p2", 1, 1, pinned=True)]
    with pytest.raises(NoPlacement) as caught:
        place(2, claims, 2)
    message = caught.value.describe(["cuda:0", "cuda:1"])
    assert "p1 on cuda:0 (pinned)" in message
    assert "p2 on cuda:1 (pinned)" in message
    assert "no block of 2 contiguous device(s)" in message


def test_width_2_model_beside_width_2_profile_on_two_devices_evicts_the_other() -> None:
    assert place(2, [Claim("m", 0, 2, last_used=1)], 2) == Placement(0, 2, ("m",))


def test_width_2_model_beside_width_2_profile_on_four_devices_needs_no_eviction() -> None:
    assert place(4, [Claim("m", 0, 2)], 2) == Placement(2, 2)


def test_overlapping_claims_are_rejected() -> None:
    with pytest.raises(ValueError, match="claimed twice"):
        place(4, [Claim("a", 0, 2), Claim("b", 1, 2)], 1)


# --- memory known: width-1 models share a device ------------------------------------------


def test_width_1_models_share_a_device_while_their_needs_fit_its_budget() -> None:
    budgets = [BUDGET]
    assert place(budgets, [_one("a", 0)], 1, need=33 * GIB) == Placement(0, 1)
    with pytest.raises(NoPlacement, match="no device can make room"):
        place(budgets, [_one("a", 0, pinned=True), _one("b", 0, pinned=True)], 1, need=33 * GIB)


def test_three_small_models_run_on_two_devices_where_exclusive_claims_evicted_one() -> None:
    budgets = [BUDGET, BUDGET]
    claims = [_one("a", 0), _one("b", 1)]
    assert place(budgets, claims, 1, need=33 * GIB) == Placement(0, 1)
    assert place(2, [Claim("a", 0, 1), Claim("b", 1, 1)], 1).evict  # unknown memory evicts


def test_spread_takes_the_device_with_fewest_models_then_the_lowest_index() -> None:
    budgets = [BUDGET, BUDGET, BUDGET]
    claims = [_one("a", 0, GIB), _one("b", 0, GIB), _one("c", 1, GIB)]
    assert place(budgets, claims, 1, need=GIB) == Placement(2, 1)
    claims.append(_one("d", 2, GIB))
    assert place(budgets, claims, 1, need=GIB) == Placement(1, 1)


def test_pack_takes_the_device_with_least_budget_left_after_placing() -> None:
    budgets = [BUDGET, BUDGET, BUDGET]
    claims = [_one("a", 0, 10 * GIB), _one("b", 1, 40 * GIB)]
    assert place(budgets, claims, 1, need=30 * GIB, strategy="pack") == Placement(1, 1)
    # 40 + 40 is over the budget: the next fullest device that fits.
    assert place(budgets, claims, 1, need=40 * GIB, strategy="pack") == Placement(0, 1)
    assert place(budgets, [], 1, need=GIB, strategy="pack") == Placement(0, 1)


def test_an_empty_device_fits_a_need_above_its_budget() -> None:
    assert place([BUDGET, BUDGET], [], 1, need=2 * BUDGET) == Placement(0, 1)
    claims = [_one("a", 0, 2 * BUDGET)]
    assert place([BUDGET, BUDGET], claims, 1, need=GIB) == Placement(1, 1)


def test_a_model_of_unknown_need_shares_its_device_with_nobody() -> None:
    budgets = [BUDGET, BUDGET]
    assert place(budgets, [_one("a", 0, GIB)], 1, need=None) == Placement(1, 1)
    claims = [_one("a", 0, None), _one("b", 1, GIB)]
    assert place(budgets, claims, 1, need=GIB) == Placement(1, 1)


def test_eviction_on_a_device_goes_least_recently_used_first_until_the_model_fits() -> None:
    claims = [
        _one("old", 0, 30 * GIB, last_used=1),
        _one("mid", 0, 30 * GIB, last_used=2),
        _one("new", 0, 10 * GIB, last_used=3),
    ]
    assert place([BUDGET], claims, 1, need=20 * GIB) == Placement(0, 1, ("old",))
    assert place([BUDGET], claims, 1, need=50 * GIB) == Placement(0, 1, ("old", "mid"))


def test_the_device_needing_fewest_evictions_wins_over_idle_time() -> None:
    claims = [
        _one("a1", 0, 30 * GIB, last_used=1),
        _one("a2", 0, 40 * GIB, last_used=2),
        _one("b1", 1, 70 * GIB, last_used=9),
    ]
    # Device 0 must lose both to fit 40 GiB; device 1 only b1, used more recently.
    assert place([BUDGET, BUDGET], claims, 1, need=40 * GIB) == Placement(1, 1, ("b1",))


def test_eviction_tie_goes_to_the_device_whose_evicted_models_idled_longest() -> None:
    claims = [_one("a", 0, 70 * GIB, last_used=5), _one("b", 1, 70 * GIB, last_used=2)]
    assert place([BUDGET, BUDGET], claims, 1, need=10 * GIB) == Placement(1, 1, ("b",))
    same = [_one("a", 0, 70 * GIB, last_used=2), _one("b", 1, 70 * GIB, last_used=2)]
    assert place([BUDGET, BUDGET], same, 1, need=10 * GIB) == Placement(0, 1, ("a",))


def test_a_device_whose_pinned_models_leave_no_room_is_skipped() -> None:
    claims = [
        _one("pinned", 0, 60 * GIB, pinned=True),
        _one("idle", 0, 10 * GIB, last_used=0),
        _one("busy", 1, 70 * GIB, last_used=9),
    ]
    # Evicting "idle" leaves 60 GiB pinned on device 0: 60 + 20 is over the budget.
    assert place([BUDGET, BUDGET], claims, 1, need=20 * GIB) == Placement(1, 1, ("busy",))
    assert place([BUDGET, BUDGET], claims, 1, need=10 * GIB) == Placement(0, 1, ("idle",))


def test_loading_residents_stay_and_can_leave_no_room() -> None:
    claims = [_one("loading", 0, 70 * GIB, evictable=False), _one("ready", 0, 5 * GIB)]
    with pytest.raises(NoPlacement) as caught:
        place([BUDGET], claims, 1, need=10 * GIB)
    assert "loading on device 0 (loading)" in str(caught.value)


def test_groups_are_displaced_only_when_groups_hold_every_device() -> None:
    budgets = [BUDGET] * 3
    claims = [Claim("group", 0, 2, last_used=0), _one("a", 2, 70 * GIB, last_used=9)]
    assert place(budgets, claims, 1, need=10 * GIB) == Placement(2, 1, ("a",))
    groups = [Claim("g-new", 0, 2, last_used=9), Claim("g-old", 2, 2, last_used=1)]
    assert place([BUDGET] * 4, groups, 1, need=GIB) == Placement(2, 1, ("g-old",))


def test_a_group_is_displaced_when_every_other_device_is_pinned_full() -> None:
    claims = [Claim("group", 0, 2, last_used=3), _one("p", 2, 70 * GIB, pinned=True)]
    assert place([BUDGET] * 3, claims, 1, need=10 * GIB) == Placement(0, 1, ("group",))


def test_pinned_groups_are_never_displaced() -> None:
    claims = [Claim("group", 0, 2, pinned=True)]
    with pytest.raises(NoPlacement, match=r"group on device 0,device 1 \(pinned\)"):
        place([BUDGET] * 2, claims, 1, need=GIB)


def test_a_group_counts_every_width_1_resident_of_its_block_as_one_eviction() -> None:
    budgets = [BUDGET] * 4
    claims = [
        _one("a", 0, GIB, last_used=1),
        _one("b", 0, GIB, last_used=2),
        _one("c", 1, GIB, last_used=3),
        Claim("g", 2, 2, last_used=9),
    ]
    # Block 0-1 holds three models, block 2-3 one group (block 1-2 four models).
    assert place(budgets, claims, 2) == Placement(2, 2, ("g",))
    claims[-1] = _one("d", 2, GIB, last_used=9)
    assert place(budgets, claims, 2) == Placement(2, 2, ("d",))


def test_a_pinned_width_1_resident_blocks_a_group_from_its_block() -> None:
    budgets = [BUDGET] * 2
    claims = [_one("p", 0, GIB, pinned=True), _one("a", 1, GIB)]
    with pytest.raises(NoPlacement, match=r"p on device 0 \(pinned\)"):
        place(budgets, claims, 2)


def test_a_group_never_shares_a_device() -> None:
    with pytest.raises(ValueError, match="claimed twice"):
        place([BUDGET] * 2, [Claim("g", 0, 2), _one("a", 1, GIB)], 1, need=GIB)
    assert place([BUDGET] * 3, [Claim("g", 0, 2)], 1, need=GIB) == Placement(2, 1)


# --- exhaustive: a brute-force reference and invariants -----------------------------------


def _reference(
    budgets: list[int | None], claims: list[Claim], width: int, need: int | None, strategy: str
) -> Placement | None:
    """The rules of the module docstring, written out as plainly as possible."""
    n = len(budgets)
    group = {i: c for c in claims if c.width > 1 for i in range(c.start, c.stop)}
    on = {i: [c for c in claims if c.width == 1 and c.start == i] for i in range(n)}

    def fits(i: int, residents: list[Claim]) -> bool:
        if not residents:
            return True
        budget = budgets[i]
        if budget is None or need is None or any(c.memory is None for c in residents):
            return False
        return sum(c.memory or 0 for c in residents) + need <= budget

    if width > 1:
        options = []
        for start in range(n - width + 1):
            holders: dict[str, Claim] = {}
            for i in range(start, start + width):
                for c in [group[i]] if i in group else on[i]:
                    holders[c.model] = c
            if any(c.pinned or not c.evictable for c in holders.values()):
                continue
            recency = max((c.last_used for c in holders.values()), default=-1.0)
            options.append((len(holders), recency, start, holders))
        if not options:
            return None
        free = [o for o in options if o[0] == 0]
        if free:
            return Placement(free[0][2], width)
        _cost, _, start, holders = min(options, key=lambda o: (o[0], o[1], o[2]))
        order = sorted(holders.values(), key=lambda c: (c.last_used, c.model))
        return Placement(start, width, tuple(c.model for c in order))
    open_ = [i for i in range(n) if i not in group]
    fitting = [i for i in open_ if fits(i, on[i])]
    if fitting:
        if strategy == "spread":
            return Placement(min(fitting, key=lambda i: (len(on[i]), i)), 1)

        def left(i: int) -> float:
            budget = budgets[i]
            if budget is None or need is None:
                return float("inf")
            return budget - sum(c.memory or 0 for c in on[i]) - need

        return Placement(min(fitting, key=lambda i: (left(i), i)), 1)
    choices = []
    for i in open_:
        lru = sorted(on[i], key=lambda c: (c.last_used, c.model))
        movable = [c for c in lru if c.evictable and not c.pinned]
        for k in range(1, len(movable) + 1):
            gone = movable[:k]
            if fits(i, [c for c in lru if c not in gone]):
                choices.append((k, max(c.last_used for c in gone), i, gone))
                break
    if choices:
        _, _, i, gone = min(choices, key=lambda o: (o[0], o[1], o[2]))
        return Placement(i, 1, tuple(c.model for c in gone))
    groups = sorted(
        {c.model: c for c in group.values() if c.evictable and not c.pinned}.values(),
        key=lambda c: (c.last_used, c.model),
    )
    if groups:
        return Placement(groups[0].start, 1, (groups[0].model,))
    return None


@st.composite
def _layouts(draw: st.DrawFn) -> tuple[list[int | None], list[Claim], int, int | None, Strategy]:
    """A worker state that keeps the invariants, and a model to place."""
    n = draw(st.integers(1, 6))
    known = draw(st.booleans())
    budgets: list[int | None] = [100 if known else None] * n
    claims: list[Claim] = []
    serial = itertools.count()

    def claim(start: int, width: int, memory: int | None) -> Claim:
        return Claim(
            f"m{next(serial)}",
            start,
            width,
            pinned=draw(st.booleans()),
            last_used=float(draw(st.integers(0, 4))),
            evictable=draw(st.sampled_from([True, True, True, False])),
            memory=memory,
        )

    i = 0
    while i < n:
        kind = draw(st.sampled_from(["empty", "single", "group"]))
        if kind == "group" and i + 1 < n:
            width = draw(st.integers(2, n - i))
            claims.append(claim(i, width, draw(st.sampled_from([None, 40, 95]))))
            i += width
            continue
        if kind == "single":
            count = draw(st.integers(1, 4 if known else 1))
            used = 0
            for _ in range(count):
                memory = draw(st.sampled_from([10, 20, 35, 60, None] if known else [None]))
                if claims and claims[-1].start == i and memory is None:
                    break  # a device of unknown share holds one model
                if memory is not None and used + memory > 100 and used:
                    break
                claims.append(claim(i, 1, memory))
                used += memory or 0
                if memory is None:
                    break
        i += 1
    width = draw(st.integers(1, n))
    need = draw(st.sampled_from([None, 5, 20, 50, 120])) if known else None
    strategy = draw(st.sampled_from(STRATEGIES))
    return budgets, claims, width, need, strategy


@given(_layouts())
@settings(max_examples=1500)
def test_placement_matches_brute_force_reference(
    layout: tuple[list[int | None], list[Claim], int, int | None, Strategy],
) -> None:
    budgets, claims, width, need, strategy = layout
    expected = _reference(budgets, claims, width, need, strategy)
    if expected is None:
        with pytest.raises(NoPlacement):
            place(budgets, claims, width, need=need, strategy=strategy)
    else:
        assert place(budgets, claims, width, need=need, strategy=strategy) == expected


@given(_layouts(), st.randoms(use_true_random=False))
@settings(max_examples=500)
def test_the_same_set_of_claims_in_any_order_gets_the_same_placement(
    layout: tuple[list[int | None], list[Claim], int, int | None, Strategy], rng: random.Random
) -> None:
    budgets, claims, width, need, strategy = layout
    shuffled = list(claims)
    rng.shuffle(shuffled)
    try:
        expected: Placement | None = place(budgets, claims, width, need=need, strategy=strategy)
    except NoPlacement:
        expected = None
    try:
        got: Placement | None = place(budgets, shuffled, width, need=need, strategy=strategy)
    except NoPlacement:
        got = None
    assert got == expected


class AllocatorMachine(RuleBasedStateMachine):
    """Any sequence of loads, uses and unloads keeps the invariants: never over budget, a
    group's devices shared with nobody, nothing pinned or loading evicted."""

    def __init__(self) -> None:
        super().__init__()
        self.budgets: list[int | None] = [100] * 8
        self.claims: dict[str, Claim] = {}
        self.clock = 0.0
        self.serial = itertools.count()

    @rule(
        width=st.sampled_from([1, 1, 1, 1, 2, 2, 4, 8]),
        need=st.sampled_from([None, 5, 10, 25, 40, 70]),
        pinned=st.booleans(),
        loading=st.booleans(),
        strategy=st.sampled_from(STRATEGIES),
    )
    def load(
        self, width: int, need: int | None, pinned: bool, loading: bool, strategy: Strategy
    ) -> None:
        self.clock += 1
        need = need if width == 1 else None
        try:
            placement = place(
                self.budgets, list(self.claims.values()), width, need=need, strategy=strategy
            )
        except NoPlacement:
            return
        for victim in placement.evict:
            claim = self.claims.pop(victim)
            assert not claim.pinned, "a pinned model was evicted"
            assert claim.evictable, "a loading model was evicted"
        model = f"m{next(self.serial)}"
        self.claims[model] = Claim(
            model, placement.start, width, pinned, self.clock, not loading, need
        )

    @rule(data=st.data())
    def use(self, data: st.DataObject) -> None:
        if self.claims:
            name = data.draw(st.sampled_from(sorted(self.claims)))
            self.clock += 1
            claim = self.claims[name]
            self.claims[name] = Claim(
                claim.model,
                claim.start,
                claim.width,
                claim.pinned,
                self.clock,
                True,
                claim.memory,
            )

    @rule(data=st.data())
    def unload(self, data: st.DataObject) -> None:
        if self.claims:
            del self.claims[data.draw(st.sampled_from(sorted(self.claims)))]

    @invariant()
    def devices_keep_their_rules(self) -> None:
        for index, budget in enumerate(self.budgets):
            here = [c for c in self.claims.values() if c.start <= index < c.stop]
            groups = [c for c in here if c.width > 1]
            assert not groups or len(here) == 1, f"device {index} shared with a group: {here}"
            if len(here) > 1:
                assert budget is not None
                assert all(c.memory is not None for c in here)
                assert sum(c.memory or 0 for c in here) <= budget, f"over budget: {here}"


TestAllocatorMachine = AllocatorMachine.TestCase
TestAllocatorMachine.settings = settings(max_examples=200, stateful_step_count=40)
