"""The LeaderWorkerSet controller of the cluster suite (tests/cluster/lws.py), with a plain
manifest: what the chart's groups of nodes rely on, checked without the chart.

Its pod webhook gives each pod of a group its rank and the leader's address, its
StatefulSets are turned into pods by kube-controller-manager, and the exclusive-topology
annotation keeps one group per topology domain.
"""

from __future__ import annotations

import re
import subprocess
from typing import Any

import pytest

from tests.cluster.controlplane import REPO
from tests.cluster.kube import GPU_RESOURCE, Kube, Nodes, NodeSpec
from tests.cluster.lws import (
    GROUP_INDEX_LABEL,
    LWS_NAME_LABEL,
    WORKER_INDEX_LABEL,
    LwsController,
)

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("lws")]

H100 = "NVIDIA-H100-80GB-HBM3"
RACK = "example.com/rack"


def group_manifest(name: str, *, size: int, gpus: int, replicas: int = 1) -> dict[str, Any]:
    """A LeaderWorkerSet of ``size`` pods of ``gpus`` GPUs each, one group per rack."""
    pod = {
        "metadata": {"labels": {"app": name}},
        "spec": {
            "containers": [
                {
                    "name": "worker",
                    "image": "registry.invalid/sie-worker:test",
                    "env": [{"name": "SIE_NODE_RANK", "value": "$(LWS_WORKER_INDEX)"}],
                    "resources": {"limits": {GPU_RESOURCE: str(gpus)}},
                }
            ],
            "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
        },
    }
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {
            "name": name,
            "annotations": {"leaderworkerset.sigs.k8s.io/exclusive-topology": RACK},
        },
        "spec": {
            "replicas": replicas,
            "leaderWorkerTemplate": {
                "size": size,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "workerTemplate": pod,
            },
        },
    }


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    [container] = pod["spec"]["containers"]
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def test_each_pod_of_a_group_gets_its_rank_the_group_size_and_the_leader_address(
    kube: Kube, namespace: str, nodes: Nodes
) -> None:
    rack_a = nodes.add(*[NodeSpec.gpu("h100", 8, H100, labels={RACK: "a"})] * 2)
    rack_b = nodes.add(*[NodeSpec.gpu("h100", 8, H100, labels={RACK: "b"})] * 2)

    kube.create(group_manifest("grp", size=2, gpus=8, replicas=2), namespace=namespace)

    pods = kube.wait_running(namespace, 4, f"{LWS_NAME_LABEL}=grp")
    by_group: dict[str, list[dict[str, Any]]] = {}
    for pod in pods:
        by_group.setdefault(pod["metadata"]["labels"][GROUP_INDEX_LABEL], []).append(pod)
    assert sorted(by_group) == ["0", "1"]
    racks = []
    for group, members in sorted(by_group.items()):
        ranks = sorted(p["metadata"]["labels"][WORKER_INDEX_LABEL] for p in members)
        assert ranks == ["0", "1"]
        for pod in members:
            env = env_of(pod)
            rank = pod["metadata"]["labels"][WORKER_INDEX_LABEL]
            assert env["LWS_WORKER_INDEX"] == rank
            assert env["LWS_GROUP_SIZE"] == "2"
            # The leader's stable name through the LWS headless Service, from every rank.
            assert env["LWS_LEADER_ADDRESS"] == f"grp-{group}.grp.{namespace}"
            # Declared after the webhook's variables, so $(LWS_WORKER_INDEX) expands.
            names = [e["name"] for e in pod["spec"]["containers"][0]["env"]]
            assert names.index("LWS_WORKER_INDEX") < names.index("SIE_NODE_RANK")
        # Eight GPUs each on 8-GPU nodes: every rank has a node of its own.
        hosts = {p["spec"]["nodeName"] for p in members}
        assert len(hosts) == 2
        # Exclusive topology: a group's pods share one rack, and no other group is there.
        rack = {"a" if h in rack_a else "b" if h in rack_b else "?" for h in hosts}
        assert len(rack) == 1
        racks.append(rack.pop())
    assert sorted(racks) == ["a", "b"]
    service = kube.get("service", "grp", "-n", namespace)
    assert service["spec"]["clusterIP"] == "None"


def test_controller_is_the_pinned_release_and_its_pod_webhooks_see_only_group_pods(
    kube: Kube, lws: LwsController
) -> None:
    go_mod = (REPO / "tools" / "lws" / "go.mod").read_text()
    pinned = re.search(r"^\s*sigs\.k8s\.io/lws (v\S+)", go_mod, re.MULTILINE)
    assert pinned is not None
    out = subprocess.run(
        [str(lws.binary), "--version"], capture_output=True, text=True, check=True
    ).stdout
    assert f"Version: {pinned.group(1)}" in out

    hooks = [
        hook
        for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations")
        for config in kube.items(kind)
        if config["metadata"]["name"].startswith("sie-test-lws-")
        for hook in config["webhooks"]
    ]
    assert {h["name"] for h in hooks} >= {"mpod.kb.io", "vpod.kb.io", "mleaderworkerset.kb.io"}
    for hook in hooks:
        assert hook["clientConfig"]["url"].startswith("https://127.0.0.1:")
        assert hook["failurePolicy"] == "Fail"
        if any("pods" in rule["resources"] for rule in hook["rules"]):
            # The release's kustomize patch: every other pod of the cluster is left alone.
            expressions = hook["objectSelector"]["matchExpressions"]
            assert expressions == [{"key": LWS_NAME_LABEL, "operator": "Exists"}]
