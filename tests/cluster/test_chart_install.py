"""`helm install`, `upgrade` and `uninstall` of chart/ against a real API server and scheduler.

What schema checks and kubeconform cannot see: objects the API server refuses or defaults,
immutable fields on upgrade, CRD validation, and whether the real scheduler places each
pool's pods on the GPU nodes it was written for. Nodes are simulated by kwok, sized from
the rendered pods: one node per pod, with the pod's GPU count, its node selector as labels
and a taint for each toleration.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.controlplane import REPO
from tests.cluster.kube import (
    GPU_COUNT_LABEL,
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    Kube,
    Nodes,
    NodeSpec,
    container_gpus,
    pod_gpus,
    unschedulable_message,
)

pytestmark = pytest.mark.cluster

CHART = REPO / "chart"
EXAMPLES = REPO / "values-examples"
L4_4X = EXAMPLES / "l4-4x.yaml"
POOL = "sie-workers/pool"
_EXAMPLE_FILES = sorted(EXAMPLES.glob("*.yaml"))


# -- helpers ------------------------------------------------------------------------------


#: `--set` overrides: "key=value" strings, or (key, value) pairs passed as JSON.
Sets = Sequence[str | tuple[str, Any]]


def _values_args(files: Sequence[Path], sets: Sets) -> list[str]:
    args = [a for f in files for a in ("-f", str(f))]
    for item in sets:
        if isinstance(item, tuple):
            args += ["--set-json", f"{item[0]}={json.dumps(item[1])}"]
        else:
            args += ["--set", item]
    return args


def render(
    kube: Kube, release: str, namespace: str, *files: Path, sets: Sets = ()
) -> list[dict[str, Any]]:
    out = kube.helm(
        "template", release, str(CHART), "-n", namespace, *_values_args(files, sets)
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def install(kube: Kube, release: str, namespace: str, *files: Path, sets: Sets = ()) -> None:
    kube.helm("install", release, str(CHART), "-n", namespace, *_values_args(files, sets))


def upgrade(kube: Kube, release: str, namespace: str, *files: Path, sets: Sets = ()) -> None:
    kube.helm("upgrade", release, str(CHART), "-n", namespace, *_values_args(files, sets))


def of_kind(docs: Sequence[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d.get("kind") == kind]


def replicas(deployment: dict[str, Any]) -> int:
    # Without `replicas` (autoscaled pools) the API server defaults it to 1.
    return int(deployment["spec"].get("replicas", 1))


def claimed_gpus(pod: dict[str, Any], docs: Sequence[dict[str, Any]]) -> int:
    """GPUs a pod claims through DRA: the devices of its ResourceClaimTemplates in ``docs``."""
    templates = {t["metadata"]["name"]: t for t in of_kind(docs, "ResourceClaimTemplate")}
    return sum(
        int(request["exactly"]["count"])
        for claim in pod.get("resourceClaims") or []
        for request in templates[claim["resourceClaimTemplateName"]]["spec"]["spec"]["devices"][
            "requests"
        ]
    )


def _allowed_gpu_counts(pod: dict[str, Any]) -> list[int]:
    """The node GPU counts a pod's required node affinity allows (empty: any)."""
    required = (
        (pod.get("affinity") or {})
        .get("nodeAffinity", {})
        .get("requiredDuringSchedulingIgnoredDuringExecution", {})
    )
    return sorted(
        int(value)
        for term in required.get("nodeSelectorTerms", [])
        for rule in term.get("matchExpressions", [])
        if rule["key"] == GPU_COUNT_LABEL
        for value in rule["values"]
    )


def nodes_for(
    deployments: Sequence[dict[str, Any]], docs: Sequence[dict[str, Any]] = ()
) -> list[NodeSpec]:
    """Nodes for every pod of ``deployments``, in whatever order the scheduler places them.

    A node carries its pods' node selector as labels and a taint per toleration. Pods with
    the same selector and tolerations can land on each other's nodes, so they share a class:
    one node per pod, each with the GPUs of the class's largest pod. Some node of the class
    is then always empty, and a small pod placed first never strands a large one. A pod
    that requires node GPU counts gets the smallest allowed one that holds it; a pod that
    claims its GPUs through DRA (templates from ``docs``) gets a node whose GPUs a DRA
    driver publishes, all under one PCIe root.
    """
    classes: dict[str, tuple[NodeSpec, int]] = {}
    for dep in deployments:
        pod = dep["spec"]["template"]["spec"]
        labels = dict(pod.get("nodeSelector") or {})
        product = labels.pop(GPU_PRODUCT_LABEL, None)
        taints = tuple(
            {"key": t["key"], "value": t.get("value") or "present", "effect": t["effect"]}
            for t in pod.get("tolerations") or []
            if t.get("key") and t.get("effect") in ("NoSchedule", "NoExecute")
        )
        claimed = claimed_gpus(pod, docs)
        gpus = pod_gpus(pod) + claimed
        gpus = min((n for n in _allowed_gpu_counts(pod) if n >= gpus), default=gpus)
        key = json.dumps([labels, product, taints, bool(claimed)], sort_keys=True)
        name = dep["metadata"]["labels"].get(POOL, "gateway")  # the gateway has no pool
        roots = ("pci0000:00",) * gpus if claimed else ()
        spec = NodeSpec(name, gpus, product, taints, labels, pcie_roots=roots)
        if key in classes:
            known, count = classes[key]
            most = max(known.gpus, spec.gpus)
            spec = replace(known, gpus=most, pcie_roots=known.pcie_roots and ("pci0000:00",) * most)
            classes[key] = (spec, count + replicas(dep))
        else:
            classes[key] = (spec, replicas(dep))
    return [spec for spec, count in classes.values() for _ in range(count)]


#: The annotation of a LeaderWorkerSet that keeps each group in a topology domain of its own.
EXCLUSIVE_TOPOLOGY = "leaderworkerset.sigs.k8s.io/exclusive-topology"


def group_size(lws: dict[str, Any]) -> int:
    return int(lws["spec"]["leaderWorkerTemplate"]["size"])


def group_pods(lws: dict[str, Any]) -> dict[str, Any]:
    """A LeaderWorkerSet as the Deployment of its pods that nodes_for reads: one pod per
    rank of every group (an unset `replicas`, autoscaled, is defaulted to one group)."""
    return {
        "metadata": lws["metadata"],
        "spec": {
            "replicas": replicas(lws) * group_size(lws),
            "template": lws["spec"]["leaderWorkerTemplate"]["workerTemplate"],
        },
    }


def group_nodes(lws: dict[str, Any]) -> list[NodeSpec]:
    """Nodes for every pod of a LeaderWorkerSet: one per rank, each group's in a topology
    domain of its own when the LeaderWorkerSet asks for exclusive topology."""
    specs = nodes_for([group_pods(lws)])
    key = (lws["metadata"].get("annotations") or {}).get(EXCLUSIVE_TOPOLOGY)
    if not key:
        return specs
    size = group_size(lws)
    return [
        replace(spec, labels={**spec.labels, key: f"domain-{i // size}"})
        for i, spec in enumerate(specs)
    ]


def pods_expected(docs: Sequence[dict[str, Any]]) -> int:
    """Pods of a rendered release: every Deployment's replicas, every group's ranks."""
    groups = of_kind(docs, "LeaderWorkerSet")
    return sum(replicas(d) for d in of_kind(docs, "Deployment")) + sum(
        replicas(g) * group_size(g) for g in groups
    )


def workers(docs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pool x bundle Deployments (not the gateway's)."""
    return [d for d in of_kind(docs, "Deployment") if POOL in d["metadata"]["labels"]]


def deployment_named(docs: Sequence[dict[str, Any]], pool: str) -> dict[str, Any]:
    [dep] = [d for d in of_kind(docs, "Deployment") if d["metadata"]["labels"].get(POOL) == pool]
    return dep


def release_name(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(2)}"


# -- tests --------------------------------------------------------------------------------


@pytest.mark.usefixtures("monitoring_crds", "gpu_device_class", "lws")
@pytest.mark.parametrize("example", _EXAMPLE_FILES, ids=[f.stem for f in _EXAMPLE_FILES])
def test_values_example_installs_and_every_pool_runs_on_its_gpu_nodes(
    kube: Kube, namespace: str, nodes: Nodes, example: Path
) -> None:
    release = release_name("ex")
    docs = render(kube, release, namespace, example)
    deployments = of_kind(docs, "Deployment")
    groups = of_kind(docs, "LeaderWorkerSet")
    nodes.add(*nodes_for(deployments, docs), *(n for g in groups for n in group_nodes(g)))

    install(kube, release, namespace, example)

    pods = kube.wait_running(namespace, pods_expected(docs))
    by_node = {n["metadata"]["name"]: n for n in kube.items("nodes")}
    gpus_used: dict[str, int] = {}
    for pod in pods:
        node = pod["spec"]["nodeName"]
        wanted = pod["spec"].get("nodeSelector") or {}
        assert wanted.items() <= by_node[node]["metadata"]["labels"].items(), node
        gpus_used[node] = gpus_used.get(node, 0) + pod_gpus(pod["spec"])
    for node, used in gpus_used.items():
        assert used <= int(by_node[node]["status"]["allocatable"].get(GPU_RESOURCE, 0))
    # GPUs from DRA claims: each pod's claim is allocated, on the pod's own node.
    for pod in pods:
        for status in pod["status"].get("resourceClaimStatuses") or []:
            claim = kube.get("resourceclaim", status["resourceClaimName"], "-n", namespace)
            results = claim["status"]["allocation"]["devices"]["results"]
            assert len(results) == claimed_gpus(pod["spec"], docs)
            assert {r["pool"] for r in results} == {pod["spec"]["nodeName"]}


def test_l4_4x_pod_waits_for_a_node_with_four_free_l4_gpus_and_the_gpu_taint(
    kube: Kube, namespace: str, nodes: Nodes
) -> None:
    release = release_name("seed")
    docs = render(kube, release, namespace, L4_4X)
    others = [
        d for d in of_kind(docs, "Deployment") if d["metadata"]["labels"].get(POOL) != "l4-4x"
    ]
    nodes.add(*nodes_for(others))
    reserved = {"key": "example.com/reserved", "value": "team-a", "effect": "NoSchedule"}
    nodes.add(
        NodeSpec.gpu("l4x2", 2),  # too few GPUs
        NodeSpec.gpu("a100x4", 4, product="NVIDIA-A100-SXM4-80GB"),  # wrong GPU model
        NodeSpec.gpu("l4x4-reserved", 4, taints=(reserved,)),  # a taint it does not tolerate
    )
    selector = f"{POOL}=l4-4x"

    install(kube, release, namespace, L4_4X)

    [pending] = kube.wait_unschedulable(namespace, 1, selector)
    why = unschedulable_message(pending) or ""
    assert f"Insufficient {GPU_RESOURCE}" in why
    assert "node affinity/selector" in why
    assert "untolerated taint" in why

    [fits] = nodes.add(NodeSpec.gpu("l4x4", 4))
    [running] = kube.wait_running(namespace, 1, selector)
    assert running["spec"]["nodeName"] == fits

    # Its four GPUs are now taken: a second replica has nowhere to go.
    name = deployment_named(docs, "l4-4x")["metadata"]["name"]
    kube.kubectl("scale", f"deployment/{name}", "-n", namespace, "--replicas=2")
    pods = kube.wait_for(
        "a second l4-4x pod the scheduler cannot place",
        lambda: [p for p in kube.pods(namespace, selector) if unschedulable_message(p)] or None,
    )
    assert f"Insufficient {GPU_RESOURCE}" in (unschedulable_message(pods[0]) or "")


def test_per_gpu_pool_of_four_runs_one_pod_holding_four_one_gpu_workers(
    kube: Kube, namespace: str, nodes: Nodes
) -> None:
    release = release_name("pergpu")
    sets = ["workers.pools.l4-4x.gpu.deviceGroup=false", "workers.pools.l4.enabled=false"]
    [node] = nodes.add(NodeSpec.gpu("l4x4", 4))

    install(kube, release, namespace, L4_4X, sets=sets)

    [pod] = kube.wait_running(namespace, 1, f"{POOL}=l4-4x")
    assert pod["spec"]["nodeName"] == node
    containers = pod["spec"]["containers"]
    workers = [c for c in containers if container_gpus(c)]
    assert [container_gpus(c) for c in workers] == [1, 1, 1, 1]
    [router] = [c for c in containers if not container_gpus(c)]
    env = {e["name"]: e.get("value") for e in router.get("env", [])}
    assert env["SIE_GPU_COUNT"] == "4"
    ready = {s["name"] for s in pod["status"]["containerStatuses"] if s["ready"]}
    assert ready == {c["name"] for c in containers}


def _rollout(kube: Kube, namespace: str, deployment: str) -> None:
    kube.kubectl(
        "rollout", "status", f"deployment/{deployment}", "-n", namespace, "--timeout=60s",
        timeout=90,
    )  # fmt: skip


def _models_checksum(kube: Kube, namespace: str, deployment: str) -> str | None:
    template = kube.get("deployment", deployment, "-n", namespace)["spec"]["template"]
    value: str | None = (template["metadata"].get("annotations") or {}).get("checksum/models")
    return value


def test_upgrade_with_changed_model_configs_rolls_the_pods(
    kube: Kube, namespace: str, nodes: Nodes
) -> None:
    release = release_name("models")
    sets = ["workers.pools.l4.enabled=false"]
    docs = render(kube, release, namespace, L4_4X, sets=sets)
    dep = deployment_named(docs, "l4-4x")
    name = dep["metadata"]["name"]
    nodes.add(*nodes_for([dep]))
    install(kube, release, namespace, L4_4X, sets=sets)
    before = kube.wait_running(namespace, 1, f"{POOL}=l4-4x")
    old_sum = _models_checksum(kube, namespace, name)
    assert old_sum is not None

    values = json.loads(
        kube.helm("get", "values", release, "-n", namespace, "-a", "-o", "json").stdout
    )
    models = values["models"]
    first = sorted(models)[0]
    profile = models[first]["profiles"]["default"]
    profile["max_batch_tokens"] = int(profile.get("max_batch_tokens") or 16384) // 2
    upgrade(kube, release, namespace, L4_4X, sets=[*sets, ("models", models)])

    _rollout(kube, namespace, name)
    after = kube.wait_running(namespace, 1, f"{POOL}=l4-4x")
    assert _models_checksum(kube, namespace, name) not in (None, old_sum)
    assert {p["metadata"]["uid"] for p in after}.isdisjoint(p["metadata"]["uid"] for p in before)
    assert (
        after[0]["metadata"]["labels"]["pod-template-hash"]
        != before[0]["metadata"]["labels"]["pod-template-hash"]
    )
    config = kube.get("configmap", "-n", namespace, "-l", f"app.kubernetes.io/instance={release}")
    assert any(
        f"max_batch_tokens: {profile['max_batch_tokens']}" in v
        for cm in config["items"]
        for v in (cm.get("data") or {}).values()
    )


def test_upgrade_to_another_pool_shape_replaces_pods_without_immutable_field_errors(
    kube: Kube, namespace: str, nodes: Nodes
) -> None:
    release = release_name("shape")
    base = ["workers.pools.l4.enabled=false"]
    nodes.add(NodeSpec.gpu("l4x4", 4))
    install(kube, release, namespace, L4_4X, sets=base)
    kube.wait_running(namespace, 1, f"{POOL}=l4-4x")
    docs = render(kube, release, namespace, L4_4X, sets=base)
    name = deployment_named(docs, "l4-4x")["metadata"]["name"]

    # Device group of four -> two one-GPU workers, with a new machine profile label.
    reshaped: list[str | tuple[str, Any]] = [
        *base,
        "workers.pools.l4-4x.gpu.deviceGroup=false",
        "workers.pools.l4-4x.gpu.count=2",
        "workers.pools.l4-4x.machineProfile=l4-2x1",
        "workers.pools.l4-4x.shmSize=8Gi",
        ("workers.pools.l4-4x.resources", {}),
    ]
    upgrade(kube, release, namespace, L4_4X, sets=reshaped)

    _rollout(kube, namespace, name)
    [pod] = kube.wait_running(namespace, 1, f"{POOL}=l4-4x")
    assert sorted(container_gpus(c) for c in pod["spec"]["containers"]) == [0, 1, 1]
    assert pod["metadata"]["labels"]["sie-workers/machine-profile"] == "l4-2x1"


def _release_leftovers(kube: Kube, namespace: str) -> list[str]:
    """Every object in ``namespace`` except what Kubernetes itself puts in each namespace."""
    kinds = kube.kubectl(
        "api-resources", "--verbs=list", "--namespaced", "-o", "name"
    ).stdout.split()
    kinds = [k for k in kinds if k not in ("events", "events.events.k8s.io")]
    out = kube.kubectl(
        "get", ",".join(kinds), "-n", namespace, "-o", "name", "--ignore-not-found"
    ).stdout.split()
    defaults = {"serviceaccount/default", "configmap/kube-root-ca.crt"}
    return sorted(set(out) - defaults)


@pytest.mark.usefixtures("monitoring_crds")
def test_uninstall_leaves_nothing_of_the_release_behind(
    kube: Kube, namespace: str, nodes: Nodes
) -> None:
    release = release_name("gone")
    mixed = EXAMPLES / "mixed.yaml"
    docs = render(kube, release, namespace, mixed)
    nodes.add(*nodes_for(of_kind(docs, "Deployment")))
    install(kube, release, namespace, mixed)
    kube.wait_running(namespace, sum(replicas(d) for d in of_kind(docs, "Deployment")))
    assert _release_leftovers(kube, namespace)

    kube.helm("uninstall", release, "-n", namespace, "--wait", "--timeout=60s")

    kube.wait_for(
        "an empty namespace after uninstall",
        lambda: not _release_leftovers(kube, namespace),
        state=lambda: "\n".join(_release_leftovers(kube, namespace)),
    )
    assert _release_leftovers(kube, namespace) == []


@pytest.mark.usefixtures("monitoring_crds")
def test_scaled_objects_are_accepted_by_the_api_server_with_the_keda_crd(
    kube: Kube, namespace: str, nodes: Nodes
) -> None:
    release = release_name("keda")
    sets = ["autoscaling.enabled=true"]
    docs = render(kube, release, namespace, L4_4X, sets=sets)
    scaled = of_kind(docs, "ScaledObject")
    assert len(scaled) == len(workers(docs))
    # Strict field validation: an unknown field the CRD would silently prune fails here.
    manifest = json.dumps({"apiVersion": "v1", "kind": "List", "items": scaled})
    kube.kubectl(
        "create", "-n", namespace, "--dry-run=server", "--validate=strict", "-f", "-",
        stdin=manifest,
    )  # fmt: skip
    nodes.add(*nodes_for(of_kind(docs, "Deployment")))

    install(kube, release, namespace, L4_4X, sets=sets)

    stored = kube.items("scaledobjects.keda.sh", "-n", namespace)
    assert sorted(s["metadata"]["name"] for s in stored) == sorted(
        s["metadata"]["name"] for s in scaled
    )
    rendered = {s["metadata"]["name"]: s["spec"] for s in scaled}
    for obj in stored:
        want = rendered[obj["metadata"]["name"]]
        assert obj["spec"]["scaleTargetRef"] == want["scaleTargetRef"]
        assert obj["spec"]["minReplicaCount"] == want["minReplicaCount"]
        assert obj["spec"]["triggers"] == want["triggers"]


@pytest.mark.usefixtures("monitoring_crds")
def test_longest_release_pool_and_bundle_names_are_accepted_by_the_api_server(
    kube: Kube, namespace: str, nodes: Nodes
) -> None:
    # Helm's longest release name (53), the schema's longest pool names (20) and the longest
    # bundle: every object name and label must still pass the API server's own checks.
    release = ("long-release-" + secrets.token_hex(20))[:53]
    pools: dict[str, Any] = {}
    for suffix in ("a", "b"):
        pools[f"l4-4x-very-long-na-{suffix}"] = {
            "enabled": True,
            "machineProfile": "l4-4x",
            "gpuType": "l4",
            "nodeSelector": {GPU_PRODUCT_LABEL: "NVIDIA-L4"},
            "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
            "gpu": {"count": 4, "deviceGroup": True},
            "shmSize": "32Gi",
            "resources": {"limits": {"memory": "128Gi"}, "requests": {"memory": "64Gi"}},
            "bundles": {"sglang-cu130": {"minReplicas": 1, "maxReplicas": 2}},
        }
    sets: list[str | tuple[str, Any]] = [
        "workers.pools.l4.enabled=false",
        *((f"workers.pools.{name}", pool) for name, pool in pools.items()),
        "autoscaling.enabled=true",
        "serviceMonitor.enabled=true",
    ]
    docs = render(kube, release, namespace, L4_4X, sets=sets)
    names = {d["metadata"]["name"] for d in workers(docs)}
    assert len(names) == 3  # two long pools and the example's l4-4x, all distinct
    nodes.add(*nodes_for(of_kind(docs, "Deployment")))

    install(kube, release, namespace, L4_4X, sets=sets)

    pods = kube.wait_running(namespace, sum(replicas(d) for d in of_kind(docs, "Deployment")))
    assert {p["metadata"]["labels"][POOL] for p in pods if POOL in p["metadata"]["labels"]} == {
        *pools,
        "l4-4x",
    }
    services = kube.items("services", "-n", namespace)
    assert {s["metadata"]["name"] for s in services} >= names


def test_release_name_with_dots_installs_whole_or_not_at_all(kube: Kube, namespace: str) -> None:
    # Helm accepts dotted release names; Service names must be DNS labels (no dots).
    release = f"team.a-{secrets.token_hex(2)}"

    result = kube.helm(
        "install", release, str(CHART), "-n", namespace, "-f", str(L4_4X), check=False
    )

    if result.returncode == 0:
        services = kube.items("services", "-n", namespace)
        assert len(services) == len(of_kind(render(kube, release, namespace, L4_4X), "Service"))
    else:
        assert release in result.stderr
        assert _release_leftovers(kube, namespace) == []
