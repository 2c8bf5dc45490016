"""Where the chart's GPU pods land, on the real scheduler: exact fits by default, node GPU
counts when required, and DRA claims with a topology constraint.

Nodes have realistic CPU and memory for their GPUs (12 cores and 48 GiB per GPU, like the
clouds' 4 x L4 machines): the default scorer then prefers the larger, less allocated node,
which is how a 3-GPU pod ends up on the only 4-GPU node and strands the 4-GPU pool unless
the chart says otherwise. DRA GPUs are ResourceSlices made by hand as NVIDIA's driver would
publish them (kube-scheduler v1.36 allocates claims against them; nothing injects devices).
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.controlplane import REPO, ControlPlane, _die_with_parent
from tests.cluster.kube import (
    DRA_DRIVER,
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    Kube,
    Nodes,
    NodeSpec,
    unschedulable_message,
)
from tests.cluster.test_chart_install import (
    POOL,
    _release_leftovers,
    _rollout,
    deployment_named,
    install,
    of_kind,
    release_name,
    render,
    upgrade,
)
from tests.support.ports import free_port

pytestmark = pytest.mark.cluster

PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
ROOT_A, ROOT_B = "pci0000:00", "pci0000:80"
L4_SELECTOR = f'device.attributes["{DRA_DRIVER}"].productName == "NVIDIA L4"'


def _sized(gpus: int) -> dict[str, str]:
    return {"cpu": str(12 * gpus), "memory": f"{48 * gpus}Gi"}


def _pool(
    count: int, *, device_group: bool = True, extra: Mapping[str, Any] | None = None, **gpu: Any
) -> dict[str, Any]:
    return {
        **(extra or {}),
        "enabled": True,
        "machineProfile": f"l4-{count}x",
        "gpuType": "l4",
        "nodeSelector": {GPU_PRODUCT_LABEL: "NVIDIA-L4"},
        "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
        "gpu": {"count": count, "deviceGroup": device_group, **gpu},
        "bundles": {"default": {"minReplicas": 1, "maxReplicas": 4}},
    }


def _values(
    tmp_path: Path, name: str, common: Mapping[str, Any] | None = None, **pools: Mapping[str, Any]
) -> Path:
    """A values file with only ``pools`` (the default l4 pool and the gateway off)."""
    values = {
        "workers": {"common": dict(common or {}), "pools": {"l4": {"enabled": False}, **pools}},
        "gateway": {"enabled": False},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(values), encoding="utf-8")
    return path


def _running(kube: Kube, namespace: str, pool: str, count: int = 1) -> list[dict[str, Any]]:
    return kube.wait_running(namespace, count, f"{POOL}={pool}")


def _uninstall(kube: Kube, release: str, namespace: str) -> None:
    kube.helm("uninstall", release, "-n", namespace, "--wait", "--timeout=60s")
    kube.wait_for(
        "an empty namespace after uninstall",
        lambda: not _release_leftovers(kube, namespace),
        state=lambda: "\n".join(_release_leftovers(kube, namespace)),
    )


# -- exact fits by default ----------------------------------------------------------------


def test_without_the_exact_fit_preference_the_scheduler_puts_a_3_gpu_pod_on_the_4_gpu_node(
    kube: Kube, namespace: str, nodes: Nodes, tmp_path: Path
) -> None:
    # The bug, reproduced with the chart's own pod minus the affinity it now adds.
    _, four = nodes.add(NodeSpec.gpu("l4x3", 3, **_sized(3)), NodeSpec.gpu("l4x4", 4, **_sized(4)))
    values = _values(tmp_path, "three", **{"l4-3x": _pool(3)})
    docs = render(kube, "bare", namespace, values)
    [dep] = of_kind(docs, "Deployment")
    dep["spec"]["template"]["spec"]["affinity"].pop("nodeAffinity")

    kube.create(*docs, namespace=namespace)

    [pod] = _running(kube, namespace, "l4-3x")
    assert pod["spec"]["nodeName"] == four

    # ... and the 4-GPU pool finds three GPUs here and one there: stranded.
    bigger = _values(tmp_path, "four", **{"l4-4x": _pool(4)})
    docs = render(kube, "bare", namespace, bigger)
    [dep] = of_kind(docs, "Deployment")
    dep["spec"]["template"]["spec"]["affinity"].pop("nodeAffinity")
    kube.create(dep, namespace=namespace)
    [pending] = kube.wait_unschedulable(namespace, 1, f"{POOL}=l4-4x")
    assert f"2 Insufficient {GPU_RESOURCE}" in (unschedulable_message(pending) or "")


def test_3_and_4_gpu_pools_both_run_on_a_3_and_a_4_gpu_node_in_every_install(
    kube: Kube, namespace: str, nodes: Nodes, tmp_path: Path
) -> None:
    three, four = nodes.add(
        NodeSpec.gpu("l4x3", 3, **_sized(3)), NodeSpec.gpu("l4x4", 4, **_sized(4))
    )
    both = _values(tmp_path, "both", **{"l4-3x": _pool(3), "l4-4x": _pool(4)})
    alone = _values(tmp_path, "alone", **{"l4-3x": _pool(3)})

    for attempt in range(4):
        release = release_name(f"fit{attempt}")
        if attempt < 3:
            install(kube, release, namespace, both)
        else:
            # The order that strands the 4-GPU pool without the preference: 3-GPU pod first.
            install(kube, release, namespace, alone)
            [first] = _running(kube, namespace, "l4-3x")
            assert first["spec"]["nodeName"] == three
            upgrade(kube, release, namespace, both)
        [small] = _running(kube, namespace, "l4-3x")
        [large] = _running(kube, namespace, "l4-4x")
        assert (small["spec"]["nodeName"], large["spec"]["nodeName"]) == (three, four), attempt
        _uninstall(kube, release, namespace)


# -- node GPU counts ----------------------------------------------------------------------


def test_node_gpu_counts_place_each_pool_on_nodes_of_those_counts_only(
    kube: Kube, namespace: str, nodes: Nodes, tmp_path: Path
) -> None:
    three, four, eight = nodes.add(
        NodeSpec.gpu("l4x3", 3, **_sized(3)),
        NodeSpec.gpu("l4x4", 4, **_sized(4)),
        NodeSpec.gpu("l4x8", 8, **_sized(8)),
    )
    # Against the exact-fit preference on purpose: the requirement decides.
    values = _values(
        tmp_path,
        "counts",
        **{"l4-3x": _pool(3, nodeGpuCounts=[4]), "l4-4x": _pool(4, nodeGpuCounts=[8])},
    )

    for attempt in range(2):
        release = release_name(f"counts{attempt}")
        install(kube, release, namespace, values)
        [small] = _running(kube, namespace, "l4-3x")
        [large] = _running(kube, namespace, "l4-4x")
        assert (small["spec"]["nodeName"], large["spec"]["nodeName"]) == (four, eight), attempt
        if attempt == 0:
            _uninstall(kube, release, namespace)

    # A second 3-GPU pod: the empty 3-GPU node and the 8-GPU node's four free GPUs do not count.
    docs = render(kube, release, namespace, values)
    name = deployment_named(docs, "l4-3x")["metadata"]["name"]
    kube.kubectl("scale", f"deployment/{name}", "-n", namespace, "--replicas=2")
    [pending] = kube.wait_for(
        "a second l4-3x pod the scheduler cannot place",
        lambda: (
            [p for p in kube.pods(namespace, f"{POOL}=l4-3x") if unschedulable_message(p)] or None
        ),
    )
    why = unschedulable_message(pending) or ""
    assert "2 node(s) didn't match Pod's node affinity/selector" in why  # l4x3 and l4x8
    assert f"1 Insufficient {GPU_RESOURCE}" in why  # l4x4: one GPU left
    assert not [p for p in kube.pods(namespace) if p["spec"].get("nodeName") == three]


# -- packing with a scheduler profile -----------------------------------------------------


def _docs_scheduler_config() -> dict[str, Any]:
    """The KubeSchedulerConfiguration docs/scheduling.md shows, as written there."""
    text = (REPO / "docs" / "scheduling.md").read_text(encoding="utf-8")
    blocks = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", text, re.DOTALL)]
    [config] = [b for b in blocks if b.get("kind") == "KubeSchedulerConfiguration"]
    return config


@pytest.fixture(scope="module")
def packing_scheduler(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A second kube-scheduler running only the docs' profile; yields its schedulerName."""
    config = _docs_scheduler_config()
    [profile] = config["profiles"]
    config["clientConnection"] = {"kubeconfig": str(control_plane.kubeconfig)}
    config["leaderElection"] = {"leaderElect": False}
    workdir = tmp_path_factory.mktemp("gpu-packing")
    (workdir / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    port = free_port()
    log = workdir / "kube-scheduler.log"
    argv = [
        str(control_plane.paths.bin("kube-scheduler")),
        f"--config={workdir / 'config.yaml'}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={workdir / 'certs'}",
    ]
    with log.open("ab") as out:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
    try:
        deadline = time.monotonic() + 60
        while not _healthy(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(
                    f"the docs' scheduler profile did not start:\n{log.read_text()[-3000:]}"
                )
            time.sleep(0.2)
        yield str(profile["schedulerName"])
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def _healthy(port: int) -> bool:
    try:
        return ControlPlane._healthz(port)
    except OSError:
        return False


def test_the_docs_packing_profile_fills_a_node_before_the_next(
    kube: Kube, namespace: str, nodes: Nodes, tmp_path: Path, packing_scheduler: str
) -> None:
    nodes.add(NodeSpec.gpu("l4x4", 4, **_sized(4)), NodeSpec.gpu("l4x4", 4, **_sized(4)))
    common = {"schedulerName": packing_scheduler}
    # Replicas of the 2-GPU pool may share a node: the pool's own (empty) podAntiAffinity.
    small = _pool(2, extra={"affinity": {"podAntiAffinity": {}}})
    small["bundles"]["default"]["minReplicas"] = 2
    release = release_name("pack")

    install(kube, release, namespace, _values(tmp_path, "small", common, **{"l4-2x": small}))

    pods = _running(kube, namespace, "l4-2x", 2)
    assert {p["spec"]["schedulerName"] for p in pods} == {packing_scheduler}
    [shared] = {p["spec"]["nodeName"] for p in pods}  # both on one node

    both = _values(tmp_path, "both", common, **{"l4-2x": small, "l4-4x": _pool(4)})
    upgrade(kube, release, namespace, both)
    [large] = _running(kube, namespace, "l4-4x")
    assert large["spec"]["nodeName"] != shared


# -- DRA claims ---------------------------------------------------------------------------


def _claims(kube: Kube, namespace: str) -> dict[str, dict[str, Any]]:
    """The namespace's ResourceClaims by the pod they belong to."""
    out: dict[str, dict[str, Any]] = {}
    for claim in kube.items("resourceclaims", "-n", namespace):
        [owner] = claim["metadata"]["ownerReferences"]
        out[owner["name"]] = claim
    return out


def _allocated(claim: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    """request -> (node, device) of an allocated claim."""
    results = claim["status"]["allocation"]["devices"]["results"]
    return {r["request"]: (r["pool"], r["device"]) for r in results}


def _roots(kube: Kube, node: str) -> dict[str, str]:
    """device -> PCIe root of a node's GPUs, as its ResourceSlice says."""
    slice_ = kube.get("resourceslice", f"{node}-{DRA_DRIVER}")
    return {d["name"]: d["attributes"][PCIE_ROOT]["string"] for d in slice_["spec"]["devices"]}


@pytest.mark.usefixtures("gpu_device_class")
def test_dra_device_group_lands_where_its_gpus_share_a_pcie_root_and_waits_for_one(
    kube: Kube, namespace: str, nodes: Nodes, tmp_path: Path
) -> None:
    # The split node is bigger: the default scorer would pick it, if the claim let it.
    split, whole = nodes.add(
        NodeSpec.dra_gpu("split", (ROOT_A, ROOT_A, ROOT_B, ROOT_B), **_sized(8)),
        NodeSpec.dra_gpu("whole", (ROOT_A,) * 4, **_sized(4)),
    )
    dra = {"enabled": True, "selectors": [L4_SELECTOR], "matchAttribute": PCIE_ROOT}
    values = _values(tmp_path, "dra", **{"l4-4x": _pool(4, dra=dra)})
    release = release_name("dra")

    install(kube, release, namespace, values)

    [pod] = _running(kube, namespace, "l4-4x")
    assert pod["spec"]["nodeName"] == whole
    [worker] = [c for c in pod["spec"]["containers"] if c["name"] == "worker-0"]
    assert GPU_RESOURCE not in worker["resources"].get("limits", {})
    devices = _allocated(_claims(kube, namespace)[pod["metadata"]["name"]])
    assert {node for node, _ in devices.values()} == {whole}
    assert len({_roots(kube, whole)[device] for _, device in devices.values()}) == 1

    # A second pod: the split node has four free GPUs, but on two roots.
    name = deployment_named(render(kube, release, namespace, values), "l4-4x")["metadata"]["name"]
    kube.kubectl("scale", f"deployment/{name}", "-n", namespace, "--replicas=2")
    [pending] = kube.wait_for(
        "a second l4-4x pod the scheduler cannot place",
        lambda: (
            [p for p in kube.pods(namespace, f"{POOL}=l4-4x") if unschedulable_message(p)] or None
        ),
    )
    assert "cannot allocate all claims" in (unschedulable_message(pending) or "")

    [joined] = nodes.add(NodeSpec.dra_gpu("joined", (ROOT_B,) * 4, **_sized(4)))
    pods = _running(kube, namespace, "l4-4x", 2)
    assert sorted(p["spec"]["nodeName"] for p in pods) == sorted([whole, joined])
    used = {node for claim in _claims(kube, namespace).values() for node, _ in
            _allocated(claim).values()}  # fmt: skip
    assert split not in used
    assert used == {whole, joined}

    _uninstall(kube, release, namespace)
    assert kube.items("resourceclaims", "-n", namespace) == []
    assert kube.items("resourceclaimtemplates", "-n", namespace) == []


@pytest.mark.usefixtures("gpu_device_class")
def test_dra_one_gpu_workers_each_get_their_own_device_and_upgrades_roll_onto_a_new_template(
    kube: Kube, namespace: str, nodes: Nodes, tmp_path: Path
) -> None:
    [split] = nodes.add(NodeSpec.dra_gpu("split", (ROOT_A, ROOT_A, ROOT_B, ROOT_B), **_sized(4)))
    dra = {"enabled": True, "matchAttribute": PCIE_ROOT}
    pool = _pool(2, device_group=False, dra=dra)
    pool["bundles"]["default"]["minReplicas"] = 2
    values = _values(tmp_path, "pergpu", **{"l4-2x1": pool})
    release = release_name("pergpu")

    install(kube, release, namespace, values)

    pods = _running(kube, namespace, "l4-2x1", 2)
    claims = _claims(kube, namespace)
    roots = _roots(kube, split)
    taken: list[str] = []
    for pod in pods:
        wanted = {
            c["name"]: c["resources"]["claims"]
            for c in pod["spec"]["containers"]
            if c["name"].startswith("worker-")
        }
        assert wanted == {
            "worker-0": [{"name": "gpus", "request": "gpu-0"}],
            "worker-1": [{"name": "gpus", "request": "gpu-1"}],
        }
        devices = _allocated(claims[pod["metadata"]["name"]])
        assert sorted(devices) == ["gpu-0", "gpu-1"]
        assert len({roots[device] for _, device in devices.values()}) == 1  # one PCIe root
        taken += [device for _, device in devices.values()]
    assert sorted(taken) == sorted(roots)  # every GPU once: each worker its own device

    # A claim template's spec is immutable: a changed claim is a new template, and pods roll.
    [before] = kube.items("resourceclaimtemplates", "-n", namespace)
    pool["gpu"]["dra"] = {**dra, "selectors": [L4_SELECTOR]}
    upgrade(kube, release, namespace, _values(tmp_path, "pergpu", **{"l4-2x1": pool}))
    [after] = kube.wait_for(
        "one new claim template",
        lambda: (
            [
                t
                for t in kube.items("resourceclaimtemplates", "-n", namespace)
                if t["metadata"]["name"] != before["metadata"]["name"]
            ]
            or None
        ),
    )
    assert after["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"]
    assert len(kube.items("resourceclaimtemplates", "-n", namespace)) == 1  # old one deleted
    name = deployment_named(render(kube, release, namespace, values), "l4-2x1")["metadata"]["name"]
    _rollout(kube, namespace, name)
    rolled = _running(kube, namespace, "l4-2x1", 2)
    templates = {p["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] for p in rolled}
    assert templates == {after["metadata"]["name"]}

    _uninstall(kube, release, namespace)
    assert kube.items("resourceclaims", "-n", namespace) == []
