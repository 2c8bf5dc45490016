"""The chart's gateway, checked against the gateway itself: the pools file it renders is read
by the gateway's own parser (one source: workers.pools), and matches the workloads."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from sie_worker.gateway.pools import parse_pools

from tests.chart._render import EXAMPLE_FILES, of_kind, render


def _pools_file(docs: list[dict]) -> object:  # type: ignore[type-arg]
    [config] = [c for c in of_kind(docs, "ConfigMap") if c["metadata"]["name"].endswith("-gateway")]
    return yaml.safe_load(config["data"]["pools.yaml"])


@pytest.mark.parametrize("example", EXAMPLE_FILES, ids=[f.stem for f in EXAMPLE_FILES])
def test_the_rendered_pools_file_is_read_by_the_gateway_and_names_every_pool_service(
    example: Path,
) -> None:
    docs = render(example)
    specs = parse_pools(_pools_file(docs), source=example.name)
    services = {
        s["metadata"]["name"]: s
        for s in of_kind(docs, "Service")
        if s["metadata"]["labels"].get("app.kubernetes.io/component") == "worker"
        and "sie-workers/metrics" not in s["metadata"]["labels"]
    }
    assert {s.service for s in specs} == set(services)
    workloads = {
        _key(w): w for w in [*of_kind(docs, "Deployment"), *of_kind(docs, "LeaderWorkerSet")]
    }
    for spec in specs:
        service = services[spec.service]
        assert service["spec"]["ports"][0]["port"] == spec.port
        workload = workloads[(spec.pool, spec.bundle)]
        labels = workload["metadata"]["labels"]
        assert labels["sie-workers/machine-profile"] == spec.machine_profile
        pod = _pod_spec(workload)
        router = next(c for c in pod["containers"] if c["name"] == "router")
        env = {e["name"]: e.get("value") for e in router["env"]}
        assert int(env["SIE_GPU_COUNT"]) == spec.slots
        # A slot's width is its worker's devices, times the nodes of a group (whose leader
        # serves models as wide as the whole group).
        worker = next(c for c in pod["containers"] if c["name"] == "worker-0")
        devices = {e["name"]: e.get("value") for e in worker["env"]}["SIE_DEVICES"]
        nodes = workload["spec"].get("leaderWorkerTemplate", {}).get("size", 1)
        assert spec.slot_width == (1 if devices == "cpu" else len(devices.split(","))) * nodes
        # The gateway and the pool's routers agree on resuming streams (the pool's resume).
        assert spec.resume == (env.get("SIE_ROUTER_RESUME_MAX") != "0")


def _key(workload: dict) -> tuple[str, str]:  # type: ignore[type-arg]
    labels = workload["metadata"]["labels"]
    return (labels.get("sie-workers/pool", ""), labels.get("sie-workers/bundle", ""))


def _pod_spec(workload: dict) -> dict:  # type: ignore[type-arg]
    if workload["kind"] == "LeaderWorkerSet":
        return workload["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]  # type: ignore[no-any-return]
    return workload["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def test_the_gateway_pods_roll_when_the_pools_change() -> None:
    def checksum(*sets: str) -> str:
        [gateway] = [
            d
            for d in of_kind(render(sets=sets), "Deployment")
            if d["metadata"]["name"].endswith("-gateway")
        ]
        return str(gateway["spec"]["template"]["metadata"]["annotations"]["checksum/pools"])

    assert checksum() != checksum("workers.pools.l4.gpu.count=2")
    assert checksum() == checksum("gateway.replicas=3")


def test_a_pool_with_resume_false_resumes_streams_neither_in_the_gateway_nor_its_routers() -> None:
    docs = render(sets=["workers.pools.l4.resume=false"])
    (spec,) = parse_pools(_pools_file(docs))
    assert spec.resume is False
    [workload] = [w for w in of_kind(docs, "Deployment") if _key(w)[0] == "l4"]
    router = next(c for c in _pod_spec(workload)["containers"] if c["name"] == "router")
    assert {"name": "SIE_ROUTER_RESUME_MAX", "value": "0"} in router["env"]
