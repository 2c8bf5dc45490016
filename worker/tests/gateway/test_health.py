"""Cluster health in SIE's shape and the union of the pods' model lists."""

from __future__ import annotations

from pathlib import Path

from sie_worker.gateway.health import cluster_health, merge_model_lists
from sie_worker.gateway.metrics import GatewayMetrics
from sie_worker.gateway.pools import PoolSpec
from sie_worker.gateway.settings import GatewaySettings
from sie_worker.gateway.state import Endpoint, Fleet, PodPoll

L4X4 = PoolSpec("l4-4x", "sglang", "l4-4x", "l4", slots=1, slot_width=4, service="a", port=1)
L4 = PoolSpec("l4", "default", "", "l4", slots=4, service="b", port=1)
ZERO = PoolSpec("h100", "sglang", "h100-8x", "h100", slot_width=8, service="c", port=1)


def _fleet() -> Fleet:
    specs = (L4X4, L4, ZERO)
    fleet = Fleet(GatewaySettings(Path("p.yaml")), specs, GatewayMetrics(s.key for s in specs))
    fleet.set_endpoints(L4X4.key, [Endpoint("big-0", "http://10.0.0.1:8080")])
    fleet.set_endpoints(
        L4.key,
        [Endpoint("small-0", "http://10.0.0.2:8080"), Endpoint("small-1", "http://10.0.0.3:8080")],
    )
    fleet.set_endpoints(ZERO.key, [])
    big = fleet.groups[L4X4.key].pods["big-0"]
    fleet.apply_poll(big, 0.0, PodPoll({"qwen": "ready", "x": "loading"}, {}, 0, 1, 1, True))
    small = fleet.groups[L4.key].pods["small-0"]
    fleet.apply_poll(small, 0.0, PodPoll({"qwen": "ready"}, {}, 0, 4, 3, True))
    return fleet


def test_health_counts_ready_pods_and_serving_slots_not_gpus() -> None:
    health = cluster_health(_fleet().groups.values())
    assert health["type"] == "gateway"
    assert health["status"] == "healthy"
    assert health["cluster"] == {"worker_count": 2, "gpu_count": 5, "models_loaded": 1}
    assert health["configured_gpu_types"] == ["h100-8x", "l4", "l4-4x"]
    assert health["live_gpu_types"] == ["l4", "l4-4x"]
    workers = {w["name"]: w for w in health["workers"]}
    assert set(workers) == {"big-0", "small-0", "small-1"}  # none for the pool at zero
    assert workers["big-0"]["gpu"] == "l4-4x"
    assert workers["small-0"]["gpu"] == "l4"  # no machine profile: the GPU type, never null
    assert workers["big-0"]["loaded_models"] == workers["big-0"]["models"] == ["qwen"]
    assert (workers["small-0"]["gpu_count"], workers["small-0"]["ready_gpu_slots"]) == (4, 3)
    assert workers["small-1"]["healthy"] is False
    assert health["models"] == [
        {
            "name": "qwen",
            "state": "loaded",
            "worker_count": 2,
            "gpu_types": ["l4-4x", "l4"],
            "total_queue_depth": 0,
        }
    ]
    assert [p["ready_pods"] for p in health["pools"]] == [1, 1, 0]


def test_health_is_degraded_without_a_ready_pod() -> None:
    fleet = Fleet(GatewaySettings(Path("p.yaml")), (ZERO,), GatewayMetrics([ZERO.key]))
    health = cluster_health(fleet.groups.values())
    assert (health["status"], health["workers"], health["live_gpu_types"]) == ("degraded", [], [])


def test_model_lists_merge_into_one_entry_per_model_with_every_pod_state() -> None:
    a = {"pool": "l4", "bundle": "default", "pod": "a"}
    b = {"pool": "l4-4x", "bundle": "sglang", "pod": "b"}
    merged = merge_model_lists(
        [
            (
                a,
                {
                    "data": [{"id": "m", "state": "loading", "slot": 0}],
                    "models": [{"name": "m", "state": "loading"}],
                },
            ),
            (
                b,
                {
                    "data": [{"id": "m", "state": "ready", "slots": []}],
                    "models": [{"name": "m", "state": "loaded"}],
                },
            ),
        ],
        ["m", "cold"],
    )
    assert merged["data"] == [
        {"id": "cold", "object": "model", "state": "unloaded", "pools": []},
        {
            "id": "m",
            "state": "ready",
            "pools": [{**a, "state": "loading"}, {**b, "state": "ready"}],
        },
    ]
    assert merged["models"] == [
        {"name": "cold", "loaded": False, "state": "available"},
        {"name": "m", "state": "loaded"},
    ]
