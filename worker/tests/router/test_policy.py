"""The routing decision (pure): the order of preferences, tie-breaks and optimistic records."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from functools import partial

from hypothesis import given, settings
from hypothesis import strategies as st

from sie_worker.backends.bound import load_cap
from sie_worker.backends.prefix import PrefixMatch, best_of
from sie_worker.router.policy import (
    Decision,
    ModelView,
    SlotView,
    choose_by_prefix,
    choose_slot,
    free_run,
    record_dispatch,
    record_served,
)
from sie_worker.router.tiers import TIERS

MODELS = ("a", "b", "c", "d")


def slot(
    index: int,
    *,
    devices: Sequence[str | None] = (None,),
    models: dict[str, ModelView] | None = None,
    outstanding: int = 0,
    up: bool = True,
) -> SlotView:
    return SlotView(
        index=index,
        up=up,
        outstanding=outstanding,
        devices=tuple((f"cuda:{i}", held) for i, held in enumerate(devices)),
        models=models or {},
    )


def ready(last_used: float | None = None, **kw: object) -> ModelView:
    return ModelView(state="ready", last_used=last_used, **kw)  # type: ignore[arg-type]


def test_ready_slot_wins_over_free_devices_and_least_outstanding_among_ready() -> None:
    slots = [
        slot(0, devices=[None]),
        slot(1, devices=["a"], models={"a": ready()}, outstanding=5),
        slot(2, devices=["a"], models={"a": ready()}, outstanding=2),
    ]
    assert choose_slot("a", slots) == Decision(2, "ready")


def test_loading_slot_is_chosen_before_a_free_device() -> None:
    slots = [
        slot(0, devices=[None]),
        slot(1, devices=["a"], models={"a": ModelView(state="loading")}, outstanding=9),
    ]
    assert choose_slot("a", slots) == Decision(1, "loading")


def test_free_device_goes_to_least_outstanding_slot() -> None:
    slots = [
        slot(0, devices=[None], outstanding=3),
        slot(1, devices=["b"], models={"b": ready()}),
        slot(2, devices=[None], outstanding=1),
    ]
    assert choose_slot("a", slots) == Decision(2, "free_device")


def test_free_device_needs_a_contiguous_run_as_wide_as_the_model() -> None:
    wide = ModelView(state="unloaded", width=2)
    split = slot(0, devices=[None, "b", None], models={"a": wide, "b": ready()})
    whole = slot(1, devices=["c", None, None], models={"a": wide, "c": ready()}, outstanding=4)
    assert choose_slot("a", [split, whole]) == Decision(1, "free_device")


def test_full_pod_evicts_on_the_slot_whose_lru_model_has_been_idle_longest() -> None:
    slots = [
        slot(0, devices=["a"], models={"a": ready(300.0)}),
        slot(1, devices=["b"], models={"b": ready(100.0)}, outstanding=7),
        slot(2, devices=["c"], models={"c": ready(200.0)}),
    ]
    assert choose_slot("d", slots) == Decision(1, "evict_lru")


def test_pinned_models_are_never_the_eviction_victim() -> None:
    slots = [
        slot(0, devices=["a"], models={"a": ready(1.0, pinned=True)}),
        slot(1, devices=["b"], models={"b": ready(500.0)}),
    ]
    assert choose_slot("c", slots) == Decision(1, "evict_lru")


def test_busy_models_are_evicted_after_idle_ones_and_unknown_idle_times() -> None:
    slots = [
        slot(0, devices=["a"], models={"a": ready(1.0, inflight=2)}),
        slot(1, devices=["b"], models={"b": ready(None)}),
    ]
    assert choose_slot("c", slots) == Decision(1, "evict_lru")


def test_only_pinned_models_left_falls_back_to_least_outstanding() -> None:
    slots = [
        slot(0, devices=["a"], models={"a": ready(pinned=True)}, outstanding=2),
        slot(1, devices=["b"], models={"b": ready(pinned=True)}, outstanding=1),
    ]
    assert choose_slot("c", slots) == Decision(1, "least_outstanding")


def test_full_pod_with_only_loading_models_waits_instead_of_queueing_a_switch() -> None:
    slots = [
        slot(0, devices=["a"], models={"a": ModelView(state="loading")}, outstanding=3),
        slot(1, devices=["b"], models={"b": ready(pinned=True)}),
    ]
    assert choose_slot("c", slots) == Decision(1, "wait")


def test_down_and_excluded_slots_are_never_chosen() -> None:
    slots = [
        slot(0, devices=["a"], models={"a": ready()}, up=False),
        slot(1, devices=["a"], models={"a": ready()}),
        slot(2, devices=[None]),
    ]
    assert choose_slot("a", slots) == Decision(1, "ready")
    assert choose_slot("a", slots, exclude={1}) == Decision(2, "free_device")
    assert choose_slot("a", slots, exclude={1, 2}) is None


def test_failed_model_counts_as_not_loaded() -> None:
    slots = [
        slot(0, devices=[None], models={"a": ModelView(state="failed")}, outstanding=1),
        slot(1, devices=[None]),
    ]
    assert choose_slot("a", slots) == Decision(1, "free_device")


def test_record_dispatch_marks_model_loading_on_a_free_device() -> None:
    before = slot(0, devices=[None, None], models={"a": ModelView()})
    after = record_dispatch(before, "a")
    assert after.models["a"].state == "loading"
    assert after.devices == (("cuda:0", "a"), ("cuda:1", None))


def test_record_dispatch_evicts_least_recently_used_unpinned_model() -> None:
    before = slot(
        0,
        devices=["b", "c"],
        models={"a": ModelView(), "b": ready(200.0), "c": ready(100.0)},
    )
    after = record_dispatch(before, "a")
    assert after.models["c"].state == "unloaded"
    assert after.models["b"].state == "ready"
    assert after.devices == (("cuda:0", "b"), ("cuda:1", "a"))


def test_record_dispatch_ignores_models_the_worker_does_not_list() -> None:
    before = slot(0, devices=[None])
    assert record_dispatch(before, "ghost") == before


def test_free_run_counts_the_longest_contiguous_free_stretch() -> None:
    devices = [("d0", None), ("d1", "x"), ("d2", None), ("d3", None), ("d4", "y")]
    assert free_run(devices) == 2
    assert free_run([]) == 0


# -- properties over random pods ---------------------------------------------------------

_model_view = st.builds(
    ModelView,
    state=st.sampled_from(["unloaded", "loading", "ready", "failed"]),
    width=st.integers(1, 2),
    pinned=st.booleans(),
    last_used=st.none() | st.floats(0, 1000, allow_nan=False),
    inflight=st.integers(0, 3),
)


@st.composite
def pods(draw: st.DrawFn) -> list[SlotView]:
    count = draw(st.integers(1, 5))
    slots = []
    for index in range(count):
        models = draw(st.dictionaries(st.sampled_from(MODELS), _model_view, max_size=4))
        holders = [m for m, v in models.items() if v.state in ("ready", "loading")]
        devices = draw(st.lists(st.sampled_from([None, *holders]), min_size=1, max_size=4))
        slots.append(
            slot(
                index,
                devices=devices,
                models=models,
                outstanding=draw(st.integers(0, 5)),
                up=draw(st.booleans()),
            )
        )
    return slots


def _expected_tier(model: str, slots: list[SlotView]) -> str | None:
    up = [s for s in slots if s.up]
    if not up:
        return None
    if any(s.state_of(model) == "ready" for s in up):
        return "ready"
    if any(s.state_of(model) == "loading" for s in up):
        return "loading"
    width = {s.index: s.models[model].width if model in s.models else 1 for s in up}
    if any(free_run(s.devices) >= width[s.index] for s in up):
        return "free_device"
    if any(v.state == "ready" and not v.pinned for s in up for v in s.models.values()):
        return "evict_lru"
    if any(v.state == "loading" for s in up for v in s.models.values()):
        return "wait"
    return "least_outstanding"


@settings(max_examples=200, deadline=None)
@given(pods(), st.sampled_from(MODELS))
def test_decision_follows_the_preference_order(slots: list[SlotView], model: str) -> None:
    decision = choose_slot(model, slots)
    tier = _expected_tier(model, slots)
    if tier is None:
        assert decision is None
        return
    assert decision is not None
    assert decision.reason == tier
    chosen = slots[decision.slot]
    assert chosen.up
    if tier in ("ready", "loading"):
        peers = [s for s in slots if s.up and s.state_of(model) == tier]
        assert chosen.state_of(model) == tier
        assert chosen.outstanding == min(s.outstanding for s in peers)
    if tier in ("wait", "least_outstanding"):
        assert chosen.outstanding == min(s.outstanding for s in slots if s.up)


@settings(max_examples=150, deadline=None)
@given(pods(), st.sampled_from(MODELS), st.randoms(use_true_random=False))
def test_decision_does_not_depend_on_the_order_slots_are_listed(
    slots: list[SlotView], model: str, rnd: object
) -> None:
    shuffled = list(slots)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    assert choose_slot(model, shuffled) == choose_slot(model, slots)


@settings(max_examples=150, deadline=None)
@given(pods(), st.sampled_from(MODELS))
def test_a_burst_follows_the_first_dispatch_to_the_same_slot(
    slots: list[SlotView], model: str
) -> None:
    first = choose_slot(model, slots)
    if first is None or first.reason == "wait" or model not in slots[first.slot].models:
        return
    recorded = list(slots)
    recorded[first.slot] = record_dispatch(slots[first.slot], model)
    again = choose_slot(model, recorded)
    assert again is not None
    assert again.slot == first.slot
    assert again.reason in ("ready", "loading")


@settings(max_examples=150, deadline=None)
@given(pods(), st.sampled_from(MODELS))
def test_record_dispatch_never_evicts_pinned_or_loading_models(
    slots: list[SlotView], model: str
) -> None:
    for before in slots:
        after = record_dispatch(before, model)
        for name, view in before.models.items():
            if name != model and (view.pinned or view.state == "loading"):
                assert after.models[name] == view
        claimed = [held for _, held in after.devices if held == model]
        if model in before.models and before.state_of(model) not in ("ready", "loading"):
            assert after.state_of(model) == "loading"
            assert len(claimed) in (0, before.models[model].width)


def test_record_served_marks_a_dispatched_model_ready() -> None:
    before = record_dispatch(slot(0, devices=[None], models={"a": ModelView()}), "a")
    after = record_served(before, "a")
    assert after.models["a"].state == "ready"
    assert after.devices == (("cuda:0", "a"),)
    assert record_served(slot(0), "ghost") == slot(0)


_cached = st.dictionaries(
    st.integers(0, 3), st.builds(PrefixMatch, st.integers(1, 5), st.integers(1, 9)), max_size=4
)


@given(
    st.lists(
        st.builds(
            slot,
            st.integers(0, 3),
            models=st.dictionaries(
                st.just("a"),
                st.builds(ModelView, st.sampled_from(["unloaded", "loading", "ready"])),
            ),
            outstanding=st.integers(0, 6),
            up=st.booleans(),
        ),
        max_size=4,
        unique_by=lambda s: s.index,
    ),
    _cached,
)
def test_the_longest_cached_prefix_within_the_bound_wins_else_none(
    slots: list[SlotView], cached: dict[int, PrefixMatch]
) -> None:
    decision = choose_by_prefix("a", slots, partial(best_of, cached))
    up = [s for s in slots if s.up]
    cap = load_cap(sum(s.outstanding for s in up), len(up) or 1)
    eligible = [
        (cached[s.index].blocks, cached[s.index].seq, -s.index)
        for s in up
        if s.index in cached
        and s.outstanding + 1 <= cap
        and s.state_of("a") in ("ready", "loading")
    ]
    if not eligible:
        assert decision is None
        return
    top = max(eligible)[:2]
    assert decision in [Decision(-i, "prefix") for b, s, i in eligible if (b, s) == top]


def test_a_model_with_reported_memory_shares_a_device_that_has_room_for_it() -> None:
    need = 10
    shared = SlotView(
        index=0,
        devices=(("cuda:0", "a"),),
        models={"a": ready(1.0), "b": ModelView(memory_bytes=need)},
        room=(need,),
    )
    assert choose_slot("b", [shared]) == Decision(0, "free_device")
    after = record_dispatch(shared, "b")
    assert (after.models["a"].state, after.models["b"].state, after.room) == (
        "ready",
        "loading",
        (0,),
    )
    # With less room the worker evicts, and so does the estimate.
    tight = SlotView(index=0, devices=shared.devices, models=shared.models, room=(need - 1,))
    assert choose_slot("b", [tight]) == Decision(0, "evict_lru")
    assert record_dispatch(tight, "b").models["a"].state == "unloaded"


# -- LoRA affinity ------------------------------------------------------------------------

ADAPTERS = ("x", "y")


@st.composite
def pods_with_adapters(draw: st.DrawFn) -> list[SlotView]:
    slots = draw(pods())
    served = st.frozensets(st.sampled_from(ADAPTERS))
    return [
        replace(
            s,
            models={m: replace(v, adapters=draw(served)) for m, v in s.models.items()},
        )
        for s in slots
    ]


@settings(max_examples=200, deadline=None)
@given(pods_with_adapters(), st.sampled_from(MODELS), st.sampled_from(ADAPTERS))
def test_an_adapter_picks_within_the_tier_its_serving_slots_first(
    slots: list[SlotView], model: str, adapter: str
) -> None:
    plain = choose_slot(model, slots)
    decision = choose_slot(model, slots, adapter=adapter)
    if plain is None:
        assert decision is None
        return
    assert decision is not None
    assert decision.reason == plain.reason  # the adapter never changes the tier
    if decision.reason not in ("ready", "loading", "free_device"):
        assert decision == plain
        return
    tier = [s for s in slots if s.up and _in_tier(model, s, decision.reason)]
    serving = [s for s in tier if adapter in s.adapters_of(model)]
    chosen = slots[decision.slot]
    if serving:
        assert chosen in serving
        assert chosen.outstanding == min(s.outstanding for s in serving)
    else:
        assert decision == plain


def _in_tier(model: str, slot: SlotView, reason: str) -> bool:
    return dict(TIERS)[reason](model, slot)  # type: ignore[index]


def test_a_busier_slot_serving_the_adapter_wins_over_an_idle_one_without() -> None:
    with_x = replace(ready(), adapters=frozenset({"x"}))
    slots = [
        slot(0, models={"a": ready()}),
        slot(1, models={"a": with_x}, outstanding=3),
    ]
    assert choose_slot("a", slots) == Decision(0, "ready")
    assert choose_slot("a", slots, adapter="x") == Decision(1, "ready")
    assert choose_slot("a", slots, adapter="y") == Decision(0, "ready")
