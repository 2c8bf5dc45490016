"""One poll reader for the router and the gateway: a worker's and a pod router's answers."""

from __future__ import annotations

import pytest

from sie_worker.backends.answers import (
    DeviceEntry,
    ModelEntry,
    parse_devices,
    parse_models,
    parse_readiness,
)


def test_models_give_state_width_pin_last_use_inflight_and_memory() -> None:
    body = {
        "object": "list",
        "data": [
            {
                "id": "a",
                "state": "ready",
                "devices": ["cuda:0", "cuda:1"],
                "width": 2,
                "pinned": True,
                "last_used": 1700000000,
                "inflight": 3,
                "memory_bytes": 5 << 30,
            },
            {"id": "org/b:fast", "state": "unloaded", "devices": [], "pinned": False},
            {"id": "c", "state": None, "devices": ["cuda:0"]},
        ],
    }
    models = parse_models(body)
    assert models["a"] == ModelEntry("ready", 2, True, 1700000000.0, 3, 5 << 30)
    assert models["org/b:fast"] == ModelEntry("unloaded", None, False, None, 0, None)
    assert models["c"] == ModelEntry("unloaded", 1)


@pytest.mark.parametrize("body", [[], {"data": "x"}, {"data": [{"state": "ready"}]}, {"data": [1]}])
def test_answers_that_are_not_a_workers_are_refused_naming_the_path(body: object) -> None:
    with pytest.raises(ValueError, match="/v1/models"):
        parse_models(body)


def test_a_negative_inflight_reads_as_none_and_adapters_are_their_bases() -> None:
    body = {
        "data": [
            {"id": "a", "state": "ready", "inflight": -2},
            {"id": "a:sql", "state": "ready", "parent": "a"},
            {"id": "b:x", "state": "loading", "parent": "b"},
            {"id": "b", "state": "loading"},
        ]
    }
    # An adapter is no model of its own: its base lists it among those it serves now (ready).
    assert parse_models(body) == {
        "a": ModelEntry("ready", inflight=0, adapters=frozenset({"sql"})),
        "b": ModelEntry("loading"),
    }


def test_devices_keep_order_every_model_on_them_and_the_memory_left() -> None:
    body = {
        "devices": [
            {
                "device": "cuda:0",
                "model": "a",
                "models": ["a", "b"],
                "memory_budget_bytes": 100,
                "memory_reserved_bytes": 70,
            },
            {"device": "cuda:1", "model": None, "slot": 1},
            {"device": "cuda:2", "model": "c"},  # a worker from before devices were shared
        ]
    }
    devices = parse_devices(body)
    assert devices == (
        DeviceEntry("cuda:0", ("a", "b"), None, 100, 70),
        DeviceEntry("cuda:1", (), 1),
        DeviceEntry("cuda:2", ("c",)),
    )
    assert [(d.model, d.room_bytes) for d in devices] == [("a", 30), (None, None), ("c", None)]
    with pytest.raises(ValueError, match="/v1/devices"):
        parse_devices({"devices": [{"model": "a"}]})


def test_a_routers_readiness_counts_its_slots_and_a_workers_is_one() -> None:
    body = {"slots": [{"ready": True}, {"ready": False}, {"ready": True}]}
    assert parse_readiness(body, True) == (3, 2)
    assert parse_readiness({"status": "ok"}, True) == (0, 1)
    assert parse_readiness(None, False) == (0, 0)
