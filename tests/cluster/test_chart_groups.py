"""Groups of nodes (``gpu.nodes``) and InferencePools of chart/ against a real API server,
scheduler and LeaderWorkerSet controller (tests/cluster/lws.py).

The seed's 2 x 8 GPU group (values-examples/h100-2x8-group.yaml) is installed on simulated
8-GPU H100 nodes, two per topology block: every pod gets its rank from the LWS webhook,
each group takes one block whole with one rank per node, the Service and the gateway reach
leaders only, a rank deleted recreates its whole group (and only it), and uninstalling
leaves nothing. The InferencePools the chart renders pass the API server's strict
validation against the CRD of the pinned Gateway API Inference Extension module.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from tests.cluster import netns
from tests.cluster.controlplane import ControlPlane
from tests.cluster.kube import Kube, Nodes
from tests.cluster.lws import GROUP_INDEX_LABEL, LWS_NAME_LABEL, WORKER_INDEX_LABEL
from tests.cluster.test_chart_install import (
    EXAMPLES,
    EXCLUSIVE_TOPOLOGY,
    _release_leftovers,
    group_nodes,
    install,
    nodes_for,
    of_kind,
    pods_expected,
    release_name,
    render,
)
from tests.cluster.test_chart_install import (
    POOL as POOL_LABEL,
)
from tests.cluster.test_gateway_discovery import _token_kubeconfig
from tests.support import loopback
from tests.support.gateway_fixtures import GatewayProcess
from tests.support.ports import free_port

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("monitoring_crds", "lws")]

GROUP_EXAMPLE = EXAMPLES / "h100-2x8-group.yaml"
POOL = "h100-2x8"
#: Two groups, counted by the chart (KEDA does not run here).
TWO_GROUPS = ["autoscaling.enabled=false", f"workers.pools.{POOL}.bundles.sglang.minReplicas=2"]

Obj = dict[str, Any]
#: A finalizer that holds a deleted pod as a kubelet's grace period would.
_GRACE = "sie-workers.test/grace-period"


def _env(container: Obj) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def _worker(pod: Obj) -> Obj:
    workers: list[Obj] = [c for c in pod["spec"]["containers"] if c["name"].startswith("worker")]
    [worker] = workers
    return worker


def _by_group(pods: list[Obj]) -> dict[str, dict[str, Obj]]:
    """{group index: {worker index: pod}}."""
    groups: dict[str, dict[str, Obj]] = {}
    for pod in pods:
        labels = pod["metadata"]["labels"]
        groups.setdefault(labels[GROUP_INDEX_LABEL], {})[labels[WORKER_INDEX_LABEL]] = pod
    return groups


def _install_two_groups(kube: Kube, namespace: str, nodes: Nodes, release: str) -> list[Obj]:
    docs = render(kube, release, namespace, GROUP_EXAMPLE, sets=TWO_GROUPS)
    [lws] = of_kind(docs, "LeaderWorkerSet")
    assert lws["metadata"]["annotations"][EXCLUSIVE_TOPOLOGY]
    # Strict: a field the pinned CRD does not know is refused here, not silently pruned.
    manifest = json.dumps({"apiVersion": "v1", "kind": "List", "items": [lws]})
    kube.kubectl("create", "-n", namespace, "--dry-run=server", "--validate=strict", "-f", "-",
                 stdin=manifest)  # fmt: skip
    nodes.add(*nodes_for(of_kind(docs, "Deployment")), *group_nodes(lws))
    install(kube, release, namespace, GROUP_EXAMPLE, sets=TWO_GROUPS)
    kube.wait_running(namespace, pods_expected(docs))
    return docs


def test_two_node_group_gets_ranks_one_block_per_group_and_restarts_whole(
    kube: Kube, namespace: str, nodes: Nodes
) -> None:
    release = release_name("grp")
    docs = _install_two_groups(kube, namespace, nodes, release)
    [lws] = of_kind(docs, "LeaderWorkerSet")
    name = lws["metadata"]["name"]
    topology = lws["metadata"]["annotations"][EXCLUSIVE_TOPOLOGY]
    selector = f"{LWS_NAME_LABEL}={name}"

    groups = _by_group(kube.pods(namespace, selector))
    assert sorted(groups) == ["0", "1"]
    node_labels = {n["metadata"]["name"]: n["metadata"]["labels"] for n in kube.items("nodes")}
    blocks = set()
    for index, ranks in groups.items():
        assert sorted(ranks) == ["0", "1"]
        for rank, pod in ranks.items():
            env = _env(_worker(pod))
            # The webhook's variables, then the chart's mapping of them (in that order, so
            # Kubernetes expands $(LWS_...) in ours).
            assert env["LWS_WORKER_INDEX"] == rank
            assert env["LWS_GROUP_SIZE"] == "2"
            assert env["LWS_LEADER_ADDRESS"] == f"{name}-{index}.{name}.{namespace}"
            assert env["SIE_NODE_RANK"] == "$(LWS_WORKER_INDEX)"
            assert env["SIE_NODES"] == "$(LWS_GROUP_SIZE)"
            assert env["SIE_LEADER_ADDRESS"] == "$(LWS_LEADER_ADDRESS)"
            names = list(env)
            assert names.index("LWS_WORKER_INDEX") < names.index("SIE_NODE_RANK")
        hosts = {p["spec"]["nodeName"] for p in ranks.values()}
        assert len(hosts) == 2, f"group {index}: both ranks on {hosts}"
        [block] = {node_labels[h][topology] for h in hosts}
        blocks.add(block)
    assert len(blocks) == 2, "two groups in one topology block"

    # A rank's pod deleted: its whole group is recreated (new leader, new worker), the other
    # group is left alone. kwok removes a deleted pod at once; a kubelet takes the grace
    # period, in which the controller sees it terminating. A finalizer holds it as long.
    before = {i: {r: p["metadata"]["uid"] for r, p in g.items()} for i, g in groups.items()}
    leader, victim = (groups["0"][rank]["metadata"]["name"] for rank in ("0", "1"))
    kube.kubectl("patch", "pod", victim, "-n", namespace, "--type=merge",
                 "-p", json.dumps({"metadata": {"finalizers": [_GRACE]}}))  # fmt: skip
    try:
        kube.kubectl("delete", "pod", victim, "-n", namespace, "--wait=false")

        # The controller deletes the group's leader (the workers go with it, as its
        # dependents: the leader stays until the held pod is released).
        def leader_deleted() -> bool:
            by_name = f"metadata.name={leader}"
            found = kube.items("pods", "-n", namespace, "--field-selector", by_name)
            meta = found[0]["metadata"] if found else {}
            return meta.get("uid") != before["0"]["0"] or "deletionTimestamp" in meta

        kube.wait_for(
            f"{leader} deleted by the controller",
            leader_deleted,
            state=lambda: kube.kubectl("get", "pods", "-n", namespace).stdout,
        )
    finally:
        kube.kubectl("patch", "pod", victim, "-n", namespace, "--type=json",
                     "-p", '[{"op": "remove", "path": "/metadata/finalizers"}]',
                     check=False)  # fmt: skip

    def recreated() -> dict[str, dict[str, Obj]] | None:
        pods = kube.wait_running(namespace, pods_expected(docs))
        now = _by_group([p for p in pods if LWS_NAME_LABEL in p["metadata"]["labels"]])
        uids = {i: {r: p["metadata"]["uid"] for r, p in g.items()} for i, g in now.items()}
        fresh = set(uids.get("0", {}).values()).isdisjoint(before["0"].values())
        return now if fresh and len(uids.get("0", {})) == 2 else None

    after = kube.wait_for(
        "group 0 recreated whole",
        recreated,
        state=lambda: kube.kubectl("get", "pods", "-n", namespace, "-o", "wide").stdout,
    )
    assert {r: p["metadata"]["uid"] for r, p in after["1"].items()} == before["1"]
    assert len({p["spec"]["nodeName"] for p in after["0"].values()}) == 2

    kube.helm("uninstall", release, "-n", namespace, "--wait", "--timeout=60s")
    kube.wait_for(
        "an empty namespace after uninstall",
        lambda: not _release_leftovers(kube, namespace),
        state=lambda: "\n".join(_release_leftovers(kube, namespace)),
    )


def test_service_inference_pool_and_gateway_reach_group_leaders_only(
    kube: Kube,
    control_plane: ControlPlane,
    namespace: str,
    nodes: Nodes,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    start_gateway: Callable[..., GatewayProcess],
) -> None:
    why = netns.NetNamespace.available()
    if why is not None:
        message = f"needs a network namespace of its own: {why}"
        if os.environ.get("CI") == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    release = release_name("lead")
    sets: list[str | tuple[str, Any]] = [
        *TWO_GROUPS,
        "inferencePool.enabled=true",
        "inferencePool.endpointPickerRef.name=llm-d-router",
        # `helm template` has no cluster to ask; `helm install` asks this one.
        ("assumeApiVersions", ["leaderworkerset.x-k8s.io/v1", "inference.networking.k8s.io/v1"]),
        "gateway.replicas=1",
    ]
    docs = render(kube, release, namespace, GROUP_EXAMPLE, sets=sets)
    [lws] = of_kind(docs, "LeaderWorkerSet")
    nodes.add(*nodes_for(of_kind(docs, "Deployment")), *group_nodes(lws))
    install(kube, release, namespace, GROUP_EXAMPLE, sets=sets)
    kube.wait_running(namespace, pods_expected(docs))
    pods = kube.pods(namespace, f"{LWS_NAME_LABEL}={lws['metadata']['name']}")
    leaders = sorted(
        p["metadata"]["name"] for p in pods if p["metadata"]["labels"][WORKER_INDEX_LABEL] == "0"
    )
    assert len(pods) == 4
    assert len(leaders) == 2

    # The pool's Service: its EndpointSlices hold the two leaders, no follower.
    gateway_name = f"{release}-sie-workers-gateway"
    config = kube.get("configmap", gateway_name, "-n", namespace)
    pools = yaml.safe_load(config["data"]["pools.yaml"])
    [pool] = [p for p in pools if p["pool"] == POOL]
    service = pool["service"]

    def endpoints() -> list[str]:
        slices = kube.items("endpointslices", "-n", namespace,
                            "-l", f"kubernetes.io/service-name={service}")  # fmt: skip
        return sorted(e["targetRef"]["name"] for s in slices for e in s.get("endpoints") or [])

    kube.wait_for("the Service's endpoints", lambda: endpoints() == leaders or None,
                  state=lambda: str(endpoints()))  # fmt: skip

    # The InferencePool, as stored (with the CRD's defaults): its selector picks the leaders.
    [inference_pool] = [
        p for p in of_kind(docs, "InferencePool") if p["metadata"]["labels"][POOL_LABEL] == POOL
    ]
    stored = kube.get("inferencepool", inference_pool["metadata"]["name"], "-n", namespace)
    want = inference_pool["spec"]
    assert stored["spec"]["selector"] == want["selector"]
    assert stored["spec"]["targetPorts"] == want["targetPorts"]
    # The CRD fills in the picker's kind (Service) and group (core), nothing else of ours.
    assert want["endpointPickerRef"].items() <= stored["spec"]["endpointPickerRef"].items()
    match = stored["spec"]["selector"]["matchLabels"]
    chosen = kube.pods(namespace, ",".join(f"{k}={v}" for k, v in match.items()))
    assert sorted(p["metadata"]["name"] for p in chosen) == leaders

    # The gateway, with the chart's ServiceAccount and pools file, in a network namespace
    # where kwok's pod addresses are local (nothing answers there: it lists them as down).
    ns = netns.NetNamespace()
    request.addfinalizer(ns.stop)
    ns.start()
    server = json.loads(control_plane.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    api_port = int(urlsplit(server).port or 443)
    ns.bridge_out(api_port, api_port, listen_host="127.0.0.1")
    gateway_port = free_port()
    ns.bridge_in(gateway_port)
    kubeconfig = _token_kubeconfig(
        kube, control_plane, namespace, gateway_name, tmp_path / "gw.kubeconfig"
    )
    gateway = start_gateway(
        pools,
        port=gateway_port,
        wrapper=ns.prefix(),
        env={"KUBECONFIG": str(kubeconfig), "SIE_GATEWAY_NAMESPACE": namespace},
    )

    def seen() -> list[str] | None:
        workers = loopback.get(gateway.url + "/health", timeout=5).json()["workers"]
        names = sorted(w["name"] for w in workers if w["pool"] == POOL)
        return names if len(names) >= len(leaders) else None

    assert kube.wait_for("the gateway to discover the group pool", seen,
                         state=lambda: gateway.logs()[-3000:]) == leaders  # fmt: skip


def test_inference_pools_pass_strict_validation_against_the_pinned_crd(
    kube: Kube, namespace: str
) -> None:
    example = EXAMPLES / "inference-pool.yaml"
    docs = render(kube, release_name("ip"), namespace, example)
    pools = of_kind(docs, "InferencePool")
    assert pools
    # Strict: a field the CRD does not know would be refused here, not silently pruned.
    manifest = json.dumps({"apiVersion": "v1", "kind": "List", "items": pools})
    kube.kubectl(
        "create", "-n", namespace, "--dry-run=server", "--validate=strict", "-f", "-",
        stdin=manifest,
    )  # fmt: skip
