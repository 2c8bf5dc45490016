"""A model's lifecycle: only its steps, the fields that belong to each state, the reason."""

from __future__ import annotations

import itertools

import pytest

from sie_worker.config.files.reader import parse_config
from sie_worker.config.model import served_model
from sie_worker.model_states import MODEL_STATES, ModelState
from sie_worker.worker.lifecycle import ALLOWED, IllegalTransition, Lifecycle
from sie_worker.worker.records import ModelRecord


def _record(state: ModelState = "unloaded") -> ModelRecord:
    config = parse_config(
        {"sie_id": "org/m", "hf_id": "org/m", "tasks": {"encode": {}}, "profiles": {"default": {}}},
        source=None,
    )
    return ModelRecord(served_model(config, "default"), state=state)


def _arguments(to: ModelState) -> dict[str, object]:
    if to == "failed":
        return {"error": "boom"}
    if to == "loading":
        return {"phase": "starting"}
    return {}


@pytest.mark.parametrize(("before", "after"), list(itertools.product(MODEL_STATES, repeat=2)))
def test_only_the_lifecycles_steps_are_taken(before: ModelState, after: ModelState) -> None:
    record, changes = _record(before), []
    life = Lifecycle(lambda: changes.append(record.state))
    if after in ALLOWED[before]:
        life.move(record, after, "test", **_arguments(after))  # type: ignore[arg-type]
        assert record.state == after
        assert changes == [after]
        assert record.last_move is not None
        assert (record.last_move.before, record.last_move.after) == (before, after)
        assert record.last_move.reason == "test"
    else:
        with pytest.raises(IllegalTransition, match="is not a step"):
            life.move(record, after, "test", **_arguments(after))  # type: ignore[arg-type]
        assert record.state == before
        assert changes == []


def test_ready_never_goes_back_to_loading_without_being_released() -> None:
    assert "loading" not in ALLOWED["ready"]


def test_a_failure_needs_its_reason_and_a_loading_model_its_phase() -> None:
    life = Lifecycle()
    with pytest.raises(IllegalTransition, match="error"):
        life.move(_record("loading"), "failed", "crash")
    with pytest.raises(IllegalTransition, match="phase"):
        life.move(_record(), "loading", "load")
    with pytest.raises(IllegalTransition, match="error"):
        life.move(_record(), "loading", "load", phase="starting", error="stale")


def test_a_model_that_stops_loading_or_serving_holds_nothing() -> None:
    life = Lifecycle()
    for to in ("unloaded", "failed"):
        record = _record("ready")
        record.block, record.memory = (0, 1), 5
        life.move(record, to, "released", **_arguments(to))  # type: ignore[arg-type]
        assert (record.block, record.memory, record.running, record.phase) == ((), None, None, None)


def test_leaving_loading_clears_the_phase_and_the_download() -> None:
    life = Lifecycle()
    record = _record()
    life.move(record, "loading", "load", phase="downloading")
    assert record.phase == "downloading"
    life.move(record, "loading", "placed", phase="starting")
    record.block = (0,)
    life.move(record, "ready", "engine ready")
    assert (record.phase, record.download, record.block) == (None, None, (0,))


def test_an_unloaded_model_may_keep_the_refusal_of_its_last_load() -> None:
    record = _record("loading")
    Lifecycle().move(record, "unloaded", "placement_failed", error="no room")
    assert (record.state, record.error) == ("unloaded", "no room")
