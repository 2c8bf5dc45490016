"""Merging the slots' ``/v1/models``: one entry per model, the furthest-along slot's fields."""

from __future__ import annotations

from sie_worker.router.merge import merge_models


def _entry(state: str, **extra: object) -> dict[str, object]:
    return {"id": "org/m", "state": state, "devices": [], "pinned": False, **extra}


def test_a_slot_downloading_a_model_shows_its_phase_and_bytes_in_the_pod_view() -> None:
    downloading = _entry("loading", phase="downloading", bytes_done=10, bytes_total=40)
    [merged] = merge_models({0: {"data": [_entry("unloaded")]}, 1: {"data": [downloading]}})
    assert (merged["slot"], merged["phase"], merged["bytes_done"]) == (1, "downloading", 10)
    assert merged["slots"][1] == {"slot": 1, **{k: v for k, v in downloading.items() if k != "id"}}
    assert "phase" not in merged["slots"][0]


def test_the_ready_slot_wins_over_one_still_downloading() -> None:
    answers = {
        0: {"data": [_entry("loading", phase="downloading", bytes_done=1, bytes_total=2)]},
        1: {"data": [_entry("ready", phase=None)]},
    }
    [merged] = merge_models(answers)
    assert (merged["slot"], merged["state"], merged["phase"]) == (1, "ready", None)
    assert merged["slots"][0]["phase"] == "downloading"
