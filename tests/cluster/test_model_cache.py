"""The model cache variants of the chart against a real API server, scheduler and volume
controllers: an existing claim, a per-pod ephemeral claim, a node folder, and the prefetch
init container. Each is accepted by the API server and its pods are scheduled and run.

Storage is simulated as kwok simulates kubelets: PersistentVolumes the test creates (a local
volume pinned to the test's node behind a ``WaitForFirstConsumer`` StorageClass without a
provisioner), which the controller-manager's binder and the scheduler's volume binding bind
as they would on a cluster with local NVMe.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster.kube import Kube, Nodes, NodeSpec
from tests.cluster.test_chart_install import (
    POOL,
    deployment_named,
    install,
    release_name,
    render,
    workers,
)

pytestmark = pytest.mark.cluster

SELECTOR = f"{POOL}=l4"


@pytest.fixture
def cluster_objects(kube: Kube) -> Iterator[list[str]]:
    """Cluster-scoped objects a test creates (``kind/name``), deleted afterwards."""
    created: list[str] = []
    yield created
    if created:
        kube.kubectl("delete", *created, "--ignore-not-found", "--wait=false")


def _local_pv(name: str, node: str, size: str, storage_class: str, mode: str) -> dict[str, Any]:
    on_node = {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": size},
            "accessModes": [mode],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": storage_class,
            "volumeMode": "Filesystem",
            "local": {"path": "/mnt/nvme/sie"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [on_node]}]}},
        },
    }


def _storage_class(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": name},
        "provisioner": "kubernetes.io/no-provisioner",
        "volumeBindingMode": "WaitForFirstConsumer",
    }


def _model_cache_volume(pod: dict[str, Any]) -> dict[str, Any]:
    [volume] = [v for v in pod["spec"]["volumes"] if v["name"] == "model-cache"]
    return volume


def test_an_existing_claim_is_mounted_as_the_model_cache_by_every_replica(
    kube: Kube, namespace: str, nodes: Nodes, cluster_objects: list[str]
) -> None:
    tag = secrets.token_hex(3)
    [node_a, node_b] = nodes.add(NodeSpec.gpu("l4x1", 1), NodeSpec.gpu("l4x1", 1))
    storage_class, pv = f"shared-{tag}", f"models-{tag}"
    kube.create(_storage_class(storage_class))
    cluster_objects.append(f"storageclass/{storage_class}")
    # A shared (ReadWriteMany) volume, as an NFS or CSI file share would be.
    volume = _local_pv(pv, node_a, "500Gi", storage_class, "ReadWriteMany")
    del volume["spec"]["nodeAffinity"]
    volume["spec"]["hostPath"] = {"path": "/mnt/share/sie"}
    del volume["spec"]["local"]
    kube.create(volume)
    cluster_objects.append(f"persistentvolume/{pv}")
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "sie-models"},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": storage_class,
            "volumeName": pv,
            "resources": {"requests": {"storage": "500Gi"}},
        },
    }
    kube.create(claim, namespace=namespace)
    sets = [
        "workers.common.modelCache.type=persistentVolumeClaim",
        "workers.common.modelCache.existingClaim=sie-models",
        "workers.pools.l4.bundles.default.minReplicas=2",
        "workers.pools.l4.bundles.default.maxReplicas=2",
    ]

    install(kube, release_name("claim"), namespace, sets=sets)

    pods = kube.wait_running(namespace, 2, SELECTOR)
    assert {p["spec"]["nodeName"] for p in pods} == {node_a, node_b}
    for pod in pods:
        assert _model_cache_volume(pod)["persistentVolumeClaim"] == {"claimName": "sie-models"}
    bound = kube.get("pvc", "sie-models", "-n", namespace)
    assert bound["status"]["phase"] == "Bound"


def test_a_per_pod_claim_is_made_for_each_pod_and_bound_on_its_node(
    kube: Kube, namespace: str, nodes: Nodes, cluster_objects: list[str]
) -> None:
    tag = secrets.token_hex(3)
    [node] = nodes.add(NodeSpec.gpu("l4x1", 1))
    storage_class, pv = f"local-nvme-{tag}", f"nvme-{tag}"
    kube.create(_storage_class(storage_class))
    kube.create(_local_pv(pv, node, "300Gi", storage_class, "ReadWriteOnce"))
    cluster_objects += [f"storageclass/{storage_class}", f"persistentvolume/{pv}"]
    release = release_name("eph")
    sets = [
        "workers.common.modelCache.type=persistentVolumeClaim",
        "workers.common.modelCache.size=200Gi",
        f"workers.common.modelCache.storageClassName={storage_class}",
        # The cache is off ephemeral storage: a cache this large no longer needs its limits.
        "workers.common.modelCache.sizeLimit=2Ti",
    ]
    docs = render(kube, release, namespace, sets=sets)
    template = deployment_named(docs, "l4")["spec"]["template"]["spec"]
    assert "ephemeral" in _model_cache_volume({"spec": template})

    install(kube, release, namespace, sets=sets)

    [pod] = kube.wait_running(namespace, 1, SELECTOR)
    assert pod["spec"]["nodeName"] == node
    claim_name = f"{pod['metadata']['name']}-model-cache"
    claim = kube.get("pvc", claim_name, "-n", namespace)
    assert claim["status"]["phase"] == "Bound"
    assert claim["spec"]["volumeName"] == pv
    assert claim["spec"]["storageClassName"] == storage_class
    assert claim["spec"]["resources"]["requests"]["storage"] == "200Gi"
    [owner] = claim["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"]) == ("Pod", pod["metadata"]["name"])  # gone with it
    assert claim["metadata"]["labels"][POOL] == "l4"


def test_a_node_folder_cache_with_prefetch_runs_its_init_container_first(
    kube: Kube, namespace: str, nodes: Nodes
) -> None:
    [node] = nodes.add(NodeSpec.gpu("l4x1", 1))
    release = release_name("host")
    sets = [
        "workers.common.modelCache.type=hostPath",
        "workers.common.modelCache.path=/mnt/nvme/sie",
        "workers.common.prefetch.enabled=true",
        "workers.common.hfToken.secretName=hf-token",
    ]
    kube.kubectl(
        "create", "secret", "generic", "hf-token", "-n", namespace, "--from-literal=token=hf_x"
    )
    docs = render(kube, release, namespace, sets=sets)
    assert len(workers(docs)) == 1

    install(kube, release, namespace, sets=sets)

    [pod] = kube.wait_running(namespace, 1, SELECTOR)
    assert pod["spec"]["nodeName"] == node
    assert _model_cache_volume(pod)["hostPath"] == {"path": "/mnt/nvme/sie", "type": "Directory"}
    [init] = pod["spec"]["initContainers"]
    assert init["name"] == "prefetch"
    assert init["args"] == ["fetch", "/etc/sie/models"]
    statuses = pod["status"].get("initContainerStatuses") or []
    assert [s["name"] for s in statuses] == ["prefetch"]
