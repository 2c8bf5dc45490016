"""Merging the slots' ``/v1/models`` (one entry per model, the furthest-along slot's fields)
and ``/v1/devices`` (every slot's devices as the worker reports them)."""

from __future__ import annotations

from sie_worker.router.merge import merge_devices, merge_models


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


def test_the_pod_view_of_devices_keeps_every_model_on_a_shared_device_and_its_memory() -> None:
    shared = {
        "device": "cuda:0",
        "model": "org/a",
        "models": ["org/a", "org/b"],
        "memory_total_bytes": 80 * 2**30,
        "memory_budget_bytes": 76 * 2**30,
        "memory_reserved_bytes": 66 * 2**30,
    }
    empty = {"device": "cuda:0", "model": None, "models": [], "memory_total_bytes": None}
    merged = merge_devices({0: {"devices": [shared]}, 1: {"devices": [empty]}})
    assert merged == [{"slot": 0, **shared}, {"slot": 1, **empty}]
