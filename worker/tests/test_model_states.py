"""The model states every view shares, and how far along each one is."""

from __future__ import annotations

import pytest

from sie_worker.model_states import MODEL_STATES, parse_state, progress


def test_states_in_lifecycle_order() -> None:
    assert MODEL_STATES == ("unloaded", "loading", "ready", "failed")


@pytest.mark.parametrize("value", ["READY", "", None, 3, "evicted"])
def test_an_unknown_reported_state_counts_as_unloaded(value: object) -> None:
    assert parse_state(value) == "unloaded"
    assert progress(value) == 0


def test_ready_is_furthest_along_then_loading_then_failed() -> None:
    assert sorted(MODEL_STATES, key=progress) == ["unloaded", "failed", "loading", "ready"]
