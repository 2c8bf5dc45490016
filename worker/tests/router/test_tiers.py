"""The router's tier scorer (pure): each tier's test of one slot, and the order they are
asked in."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sie_worker.router.policy import ModelView, SlotView
from sie_worker.router.tiers import (
    TIERS,
    can_evict,
    fits_now,
    free_run,
    holds_loading,
    holds_ready,
    idle_key,
    shared_device,
)


def _slot(devices: tuple[str | None, ...] = (None,), **models: ModelView) -> SlotView:
    held = tuple((f"cuda:{i}", m) for i, m in enumerate(devices))
    return SlotView(index=0, devices=held, models=models)


def test_the_tiers_are_asked_best_first() -> None:
    assert [name for name, _ in TIERS] == ["ready", "loading", "free_device", "evict_lru"]


@given(st.lists(st.none() | st.just("m"), max_size=8))
def test_free_run_is_the_longest_stretch_of_free_devices(held: list[str | None]) -> None:
    runs = "".join("." if h is None else "x" for h in held).split("x")
    assert free_run((f"d{i}", h) for i, h in enumerate(held)) == max(map(len, runs))


def test_a_slot_holds_a_model_ready_or_loading_as_its_worker_says() -> None:
    slot = _slot(a=ModelView("ready"), b=ModelView("loading"))
    assert (holds_ready("a", slot), holds_loading("a", slot)) == (True, False)
    assert (holds_ready("b", slot), holds_loading("b", slot)) == (False, True)
    assert not holds_ready("c", slot)
    assert not holds_loading("c", slot)


def test_a_model_fits_a_free_run_as_wide_or_a_device_with_room_for_it() -> None:
    wide = ModelView(width=2)
    assert fits_now("w", _slot((None, None), w=wide))
    assert not fits_now("w", _slot((None, "x", None), w=wide))
    small = ModelView(memory_bytes=10)
    shared = SlotView(index=0, devices=(("cuda:0", "x"),), models={"s": small}, room=(20,))
    assert shared_device(small, shared) == 0
    assert fits_now("s", shared)
    assert not fits_now(
        "s", SlotView(0, devices=(("cuda:0", "x"),), models={"s": small}, room=(5,))
    )


def test_only_an_idle_unpinned_ready_model_makes_room() -> None:
    assert can_evict("m", _slot(("o",), o=ModelView("ready")))
    assert not can_evict("m", _slot(("o",), o=ModelView("ready", pinned=True)))
    assert not can_evict("m", _slot(("o",), o=ModelView("loading")))


def test_idle_models_sort_by_last_use_then_unknown_then_busy() -> None:
    keys = [
        idle_key(ModelView("ready", inflight=1)),
        idle_key(ModelView("ready")),
        idle_key(ModelView("ready", last_used=5.0)),
        idle_key(ModelView("ready", last_used=1.0)),
    ]
    assert sorted(keys) == keys[::-1]
