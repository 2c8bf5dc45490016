"""The control plane itself, with plain manifests: GPU scheduling, taints, garbage collection.

These hold whatever the chart does, so a chart test that fails while these pass points at
the chart, not at the cluster.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.cluster.controlplane import REPO
from tests.cluster.kube import (
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    Kube,
    Nodes,
    NodeSpec,
    unschedulable_message,
)

pytestmark = pytest.mark.cluster


def _gpu_deployment(name: str, gpus: int, *, tolerate: bool = True) -> dict[str, Any]:
    labels = {"app": name}
    pod: dict[str, Any] = {
        "nodeSelector": {GPU_PRODUCT_LABEL: "NVIDIA-L4"},
        "containers": [
            {
                "name": "main",
                "image": "registry.invalid/never-pulled:1",
                "resources": {"limits": {GPU_RESOURCE: str(gpus)}},
            }
        ],
    }
    if tolerate:
        pod["tolerations"] = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }


def test_api_server_reports_the_kubernetes_version_pinned_in_go_mod(kube: Kube) -> None:
    # Charts gate on kubeVersion, so an unstamped build (v0.0.0-master) would refuse them.
    go_mod = (REPO / "tools" / "cluster" / "go.mod").read_text()
    pinned = re.search(r"^\s*k8s\.io/kubernetes (v\S+)", go_mod, re.MULTILINE)
    assert pinned is not None

    version = json.loads(kube.kubectl("get", "--raw", "/version").stdout)

    assert version["gitVersion"] == pinned.group(1)


def test_gpu_pod_stays_pending_until_a_node_with_enough_gpus_joins(
    kube: Kube, namespace: str, nodes: Nodes
) -> None:
    nodes.add(NodeSpec.gpu("l4x2", 2))
    kube.create(_gpu_deployment("wants-four", 4), namespace=namespace)

    [pending] = kube.wait_unschedulable(namespace, 1)
    assert f"Insufficient {GPU_RESOURCE}" in (unschedulable_message(pending) or "")

    [big] = nodes.add(NodeSpec.gpu("l4x4", 4))
    [running] = kube.wait_running(namespace, 1)
    assert running["spec"]["nodeName"] == big


def test_gpu_taint_keeps_pods_without_its_toleration_away(
    kube: Kube, namespace: str, nodes: Nodes
) -> None:
    nodes.add(NodeSpec.gpu("l4x4", 4))
    kube.create(_gpu_deployment("no-toleration", 4, tolerate=False), namespace=namespace)

    [pending] = kube.wait_unschedulable(namespace, 1)
    assert "untolerated taint" in (unschedulable_message(pending) or "")


def test_deleting_a_deployment_removes_its_pods(kube: Kube, namespace: str, nodes: Nodes) -> None:
    nodes.add(NodeSpec.gpu("l4x1", 1))
    kube.create(_gpu_deployment("short-lived", 1), namespace=namespace)
    kube.wait_running(namespace, 1)

    kube.kubectl("delete", "deployment", "short-lived", "-n", namespace)

    kube.wait_gone("pods", namespace, "app=short-lived")
    kube.wait_gone("replicasets", namespace, "app=short-lived")
