"""Pod state: what polls say, what the gateway dispatched since, pods joining and leaving."""

from __future__ import annotations

from pathlib import Path

from sie_worker.backends.answers import BackendPoll, parse_devices, parse_models
from sie_worker.gateway.metrics import GatewayMetrics
from sie_worker.gateway.pod_poll import free_run_per_slot, pod_poll, slot_width_of
from sie_worker.gateway.pools import PoolSpec
from sie_worker.gateway.settings import GatewaySettings
from sie_worker.gateway.state import Endpoint, Fleet, PodPoll

SPEC = PoolSpec("l4", "sglang", "l4", "l4", slots=2, service="s", port=1)
KEY = SPEC.key


def _fleet() -> Fleet:
    return Fleet(GatewaySettings(Path("p.yaml")), (SPEC,), GatewayMetrics([KEY]))


def test_a_pod_router_answer_gives_states_widths_and_the_widest_free_run_per_slot() -> None:
    answer = BackendPoll(
        parse_models(
            {"data": [{"id": "a", "state": "ready", "width": 2}, {"id": "b", "state": None}]}
        ),
        parse_devices(
            {
                "devices": [
                    {"slot": 0, "device": "cuda:0", "model": "a"},
                    {"slot": 0, "device": "cuda:1", "model": None},
                    {"slot": 1, "device": "cuda:0", "model": None},
                    {"slot": 1, "device": "cuda:1", "model": None},
                ]
            }
        ),
        True,
        slots=2,
        ready_slots=1,
    )
    assert pod_poll(answer) == PodPoll({"a": "ready", "b": "unloaded"}, {"a": 2}, 2, 2, 1, True, 2)
    # Free devices of two slots never make one run.
    split = parse_devices({"devices": [{"device": "x", "slot": s, "model": None} for s in (0, 1)]})
    assert free_run_per_slot(split) == 1


def test_a_dispatch_counts_as_loading_until_a_later_poll_says_otherwise() -> None:
    fleet = _fleet()
    fleet.set_endpoints(KEY, [Endpoint("p0", "http://127.0.0.1:1")])
    pod = fleet.groups[KEY].pods["p0"]
    fleet.apply_poll(pod, 1.0, PodPoll({"a": "unloaded"}, {"a": 1}, 1, 2, 2, True))
    assert pod.routable
    fleet.clock = lambda: 2.0
    fleet.dispatched(pod, "a", "free_slot")
    assert (pod.models["a"], pod.free_run, pod.outstanding) == ("loading", 0, 1)
    # A poll that started before the dispatch does not undo it; one after it does.
    fleet.apply_poll(pod, 1.5, PodPoll({"a": "unloaded"}, {"a": 1}, 1, 2, 2, True))
    assert pod.models["a"] == "loading"
    fleet.finished(pod, "a", served=True)
    assert (pod.models["a"], pod.outstanding) == ("ready", 0)
    fleet.apply_poll(pod, 3.0, PodPoll({"a": "ready"}, {"a": 1}, 0, 2, 2, True))
    assert pod.pending == []


def test_a_pod_that_leaves_finishes_its_requests_and_one_marked_down_aborts_them() -> None:
    fleet = _fleet()
    fleet.set_endpoints(KEY, [Endpoint("p0", "http://a:1"), Endpoint("p1", "http://b:1")])
    p0, p1 = (fleet.groups[KEY].pods[n] for n in ("p0", "p1"))
    for pod in (p0, p1):
        fleet.apply_poll(pod, 0.0, PodPoll({}, {}, 1, 2, 2, True))
        fleet.dispatched(pod, None, "least_outstanding")
    aborted: list[str] = []
    p1.aborts.add(lambda: aborted.append("p1"))
    fleet.set_endpoints(KEY, [Endpoint("p1", "http://b:1")])
    assert p0.removed
    assert not p0.routable
    assert "p0" in fleet.groups[KEY].pods  # still finishing its request
    fleet.finished(p0, None, served=True)
    assert "p0" not in fleet.groups[KEY].pods
    fleet.mark_down(p1, "connection refused")
    assert aborted == ["p1"]
    assert (p1.up, p1.answering, p1.down, p1.last_error) == (
        False,
        False,
        True,
        "connection refused",
    )


def test_a_pool_at_zero_is_discovered_with_no_pods() -> None:
    fleet = _fleet()
    assert not fleet.groups[KEY].discovered
    fleet.set_endpoints(KEY, [])
    assert fleet.groups[KEY].discovered
    assert fleet.groups[KEY].routable() == []


def test_a_pod_router_answer_gives_the_devices_of_its_widest_slot() -> None:
    devices = [{"device": f"cuda:{i}", "slot": i // 2, "model": None} for i in range(4)]
    assert slot_width_of(parse_devices({"devices": devices})) == 2
    unslotted = {"devices": [{"device": "cuda:0"}, {"device": "cuda:1"}]}
    assert slot_width_of(parse_devices(unslotted)) == 2
    assert slot_width_of(()) == 0


def test_a_dispatch_in_flight_outlives_a_poll_answered_before_the_pod_saw_it() -> None:
    # The router's rule, shared: a burst keeps following its first request to the same pod
    # (and loads the model once) even when a poll that started after the dispatch, but was
    # answered before the request reached the pod, still lists the model unloaded.
    fleet = _fleet()
    fleet.set_endpoints(KEY, [Endpoint("p0", "http://127.0.0.1:1")])
    pod = fleet.groups[KEY].pods["p0"]
    fleet.apply_poll(pod, 1.0, PodPoll({"a": "unloaded"}, {"a": 1}, 1, 2, 2, True))
    fleet.clock = lambda: 2.0
    fleet.dispatched(pod, "a", "free_slot")
    fleet.apply_poll(pod, 3.0, PodPoll({"a": "unloaded"}, {"a": 1}, 1, 2, 2, True))
    assert (pod.models["a"], pod.free_run) == ("loading", 0)
    # Once the request ended, a later poll is the truth again.
    fleet.finished(pod, "a", served=False)
    fleet.apply_poll(pod, 4.0, PodPoll({"a": "unloaded"}, {"a": 1}, 1, 2, 2, True))
    assert (pod.models["a"], pod.pending) == ("unloaded", [])
