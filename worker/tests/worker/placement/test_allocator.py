from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from sie_worker.worker.placement.allocator import Claim, NoPlacement, Placement, place


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


def test_width_2_model_beside_width_2_profile_on_two_devices_evicts_the_other() -> None:
    assert place(2, [Claim("m", 0, 2, last_used=1)], 2) == Placement(0, 2, ("m",))


def test_width_2_model_beside_width_2_profile_on_four_devices_needs_no_eviction() -> None:
    assert place(4, [Claim("m", 0, 2)], 2) == Placement(2, 2)


def test_overlapping_claims_are_rejected() -> None:
    with pytest.raises(ValueError, match="claimed twice"):
        place(4, [Claim("a", 0, 2), Claim("b", 1, 2)], 1)


# --- exhaustive check against a brute-force reference -------------------------------------


def _reference(n: int, claims: list[Claim], width: int) -> Placement | None:
    owner: dict[int, Claim] = {i: c for c in claims for i in range(c.start, c.stop)}
    options = []
    for start in range(n - width + 1):
        holders = {owner[i].model: owner[i] for i in range(start, start + width) if i in owner}
        if any(c.pinned or not c.evictable for c in holders.values()):
            continue
        recency = max((c.last_used for c in holders.values()), default=-1.0)
        options.append((len(holders), recency if holders else -1.0, start, holders))
    if not options:
        return None
    free = [o for o in options if o[0] == 0]
    if free:
        return Placement(free[0][2], width)
    cost, _, start, holders = min(options, key=lambda o: (o[0], o[1], o[2]))
    assert cost == len(holders)
    order = tuple(c.model for c in sorted(holders.values(), key=lambda c: c.last_used))
    return Placement(start, width, order)


@st.composite
def _layouts(draw: st.DrawFn) -> tuple[int, list[Claim], int]:
    n = draw(st.integers(1, 8))
    claims: list[Claim] = []
    i = 0
    serial = itertools.count()
    while i < n:
        if draw(st.booleans()):
            i += 1
            continue
        width = draw(st.integers(1, n - i))
        claims.append(
            Claim(
                f"m{next(serial)}",
                i,
                width,
                pinned=draw(st.booleans()),
                last_used=float(draw(st.integers(0, 5))),
                evictable=draw(st.sampled_from([True, True, True, False])),
            )
        )
        i += width
    width = draw(st.integers(1, n))
    return n, claims, width


@given(_layouts())
@settings(max_examples=600)
def test_placement_matches_brute_force_reference(layout: tuple[int, list[Claim], int]) -> None:
    n, claims, width = layout
    expected = _reference(n, claims, width)
    if expected is None:
        with pytest.raises(NoPlacement):
            place(n, claims, width)
    else:
        assert place(n, claims, width) == expected


# --- state machine: claims stay consistent over any sequence of loads and unloads ---------


class AllocatorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.n = 8
        self.claims: dict[str, Claim] = {}
        self.clock = 0.0
        self.serial = itertools.count()

    @rule(
        width=st.sampled_from([1, 1, 2, 2, 4, 8]),
        pinned=st.booleans(),
        loading=st.booleans(),
    )
    def load(self, width: int, pinned: bool, loading: bool) -> None:
        self.clock += 1
        before = dict(self.claims)
        try:
            placement = place(self.n, list(self.claims.values()), width)
        except NoPlacement:
            # Refused only when every block holds a pinned or loading model.
            for start in range(self.n - width + 1):
                window = [c for c in before.values() if c.start < start + width and start < c.stop]
                assert any(c.pinned or not c.evictable for c in window)
            return
        for victim in placement.evict:
            claim = self.claims.pop(victim)
            assert not claim.pinned, "a pinned model was evicted"
            assert claim.evictable, "a loading model was evicted"
        model = f"m{next(self.serial)}"
        self.claims[model] = Claim(
            model, placement.start, width, pinned, self.clock, evictable=not loading
        )
        # Evictions are minimal: nothing evicted that does not overlap the new block.
        for victim in placement.evict:
            old = before[victim]
            assert old.start < placement.start + width
            assert placement.start < old.stop

    @precondition(lambda self: bool(self.claims))
    @rule(data=st.data())
    def unload(self, data: st.DataObject) -> None:
        model = data.draw(st.sampled_from(sorted(self.claims)))
        del self.claims[model]

    @precondition(lambda self: bool(self.claims))
    @rule(data=st.data())
    def use(self, data: st.DataObject) -> None:
        model = data.draw(st.sampled_from(sorted(self.claims)))
        self.clock += 1
        old = self.claims[model]
        self.claims[model] = Claim(
            old.model, old.start, old.width, old.pinned, self.clock, evictable=True
        )

    @invariant()
    def no_device_claimed_twice(self) -> None:
        seen: set[int] = set()
        for claim in self.claims.values():
            block = set(range(claim.start, claim.stop))
            assert not (block & seen)
            assert claim.stop <= self.n
            seen |= block


TestAllocatorMachine = AllocatorMachine.TestCase
TestAllocatorMachine.settings = settings(max_examples=150, stateful_step_count=40)
