"""kubectl and helm against the test control plane, simulated GPU nodes, and polling.

Every wait polls with a deadline and fails with the state it last saw, so a broken
cluster or chart ends a test with a readable message instead of hanging it.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from tests.cluster.controlplane import KWOK_NODE_ANNOTATION

__all__ = [
    "DRA_DRIVER",
    "GPU_COUNT_LABEL",
    "GPU_PRODUCT_LABEL",
    "GPU_RESOURCE",
    "CommandFailed",
    "Kube",
    "NodeSpec",
    "Nodes",
    "container_gpus",
    "device_class_manifest",
    "node_manifest",
    "pod_gpus",
    "resource_slice_manifest",
    "unschedulable_message",
]

GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
#: NVIDIA's DRA driver: its name, its DeviceClass's name and its attributes' domain.
DRA_DRIVER = "gpu.nvidia.com"
_WAIT_S = 60.0
_POLL_S = 0.2

T = TypeVar("T")
Obj = dict[str, Any]


class CommandFailed(AssertionError):
    """kubectl or helm exited non-zero; carries its stderr for the assertion message."""

    def __init__(self, argv: Sequence[str], result: subprocess.CompletedProcess[str]) -> None:
        self.stderr = result.stderr
        self.returncode = result.returncode
        cmd = " ".join(argv)
        super().__init__(f"`{cmd}` exited {result.returncode}:\n{result.stderr.strip()}")


@dataclass(frozen=True)
class NodeSpec:
    """A simulated node: GPU count and product, taints, extra labels, CPU and memory.

    With ``pcie_roots`` its GPUs are published by a DRA driver (a ResourceSlice of one device
    per entry, on that PCIe root) instead of the device plugin's ``nvidia.com/gpu`` capacity.
    """

    name: str
    gpus: int = 0
    product: str | None = None
    taints: tuple[Mapping[str, str], ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    cpu: str = "256"
    memory: str = "2Ti"
    pcie_roots: tuple[str, ...] = ()

    @classmethod
    def gpu(cls, name: str, gpus: int, product: str = "NVIDIA-L4", **kw: Any) -> NodeSpec:
        """A GPU node as the NVIDIA GPU operator labels and taints it."""
        gpu_taint = {"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}
        taints = (gpu_taint, *kw.pop("taints", ()))
        return cls(name, gpus, product, taints, **kw)

    @classmethod
    def dra_gpu(
        cls, name: str, pcie_roots: Sequence[str], product: str = "NVIDIA-L4", **kw: Any
    ) -> NodeSpec:
        """A GPU node whose GPUs NVIDIA's DRA driver publishes, one per PCIe root listed."""
        return cls.gpu(name, len(pcie_roots), product, pcie_roots=tuple(pcie_roots), **kw)


def node_manifest(spec: NodeSpec) -> Obj:
    """The Node object kwok picks up (by its annotation) and keeps Ready."""
    labels = {
        "kubernetes.io/hostname": spec.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        **spec.labels,
    }
    capacity = {"cpu": spec.cpu, "memory": spec.memory, "pods": "110", "ephemeral-storage": "4Ti"}
    if spec.gpus:
        # GPU feature discovery labels the count either way; a DRA node has no device plugin.
        labels[GPU_COUNT_LABEL] = str(spec.gpus)
        if not spec.pcie_roots:
            capacity[GPU_RESOURCE] = str(spec.gpus)
    if spec.product:
        labels[GPU_PRODUCT_LABEL] = spec.product
    key, value = KWOK_NODE_ANNOTATION.split("=")
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": spec.name, "labels": labels, "annotations": {key: value}},
        "spec": {"taints": [dict(t) for t in spec.taints]},
        # The API server keeps status given on create; kwok keeps capacity as given.
        "status": {"capacity": capacity, "allocatable": capacity},
    }


def device_class_manifest() -> Obj:
    """The DeviceClass NVIDIA's DRA driver installs: its driver's devices of type gpu."""
    expression = (
        f"device.driver == '{DRA_DRIVER}' && device.attributes['{DRA_DRIVER}'].type == 'gpu'"
    )
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DRA_DRIVER},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }


def resource_slice_manifest(spec: NodeSpec, node_uid: str) -> Obj:
    """The ResourceSlice NVIDIA's DRA driver publishes for a node's GPUs, owned by the node
    (as the kubelet plugin's is, so it goes with the node)."""
    product = (spec.product or "NVIDIA-L4").replace("-", " ")  # GFD's label: spaces as dashes
    devices = [
        {
            "name": f"gpu-{i}",
            "attributes": {
                "type": {"string": "gpu"},
                "uuid": {"string": f"GPU-{spec.name}-{i}"},
                "productName": {"string": product},
                "architecture": {"string": "Ada Lovelace"},
                "cudaComputeCapability": {"version": "8.9.0"},
                "resource.kubernetes.io/pciBusID": {"string": f"0000:{0x10 * (i + 1):02x}:00.0"},
                "resource.kubernetes.io/pcieRoot": {"string": root},
            },
            "capacity": {"memory": {"value": "24Gi"}},
        }
        for i, root in enumerate(spec.pcie_roots)
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {
            "name": f"{spec.name}-{DRA_DRIVER}",
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": spec.name, "uid": node_uid}
            ],
        },
        "spec": {
            "driver": DRA_DRIVER,
            "nodeName": spec.name,
            "pool": {"name": spec.name, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def container_gpus(container: Mapping[str, Any]) -> int:
    resources = container.get("resources") or {}
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    return int(limits.get(GPU_RESOURCE, requests.get(GPU_RESOURCE, 0)))


def pod_gpus(pod_spec: Mapping[str, Any]) -> int:
    return sum(container_gpus(c) for c in pod_spec.get("containers", []))


def unschedulable_message(pod: Mapping[str, Any]) -> str | None:
    """The scheduler's reason when it tried and found no node, else None."""
    for cond in pod.get("status", {}).get("conditions", []):
        if cond["type"] == "PodScheduled" and cond.get("reason") == "Unschedulable":
            return str(cond.get("message", ""))
    return None


def _describe_pods(pods: Iterable[Mapping[str, Any]]) -> str:
    lines = []
    for pod in pods:
        status = pod.get("status", {})
        why = unschedulable_message(pod) or ""
        lines.append(
            f"{pod['metadata']['name']}: {status.get('phase')} on "
            f"{pod['spec'].get('nodeName') or '-'} {why}".rstrip()
        )
    return "\n".join(lines) or "(no pods)"


@dataclass(frozen=True)
class Kube:
    """kubectl and helm bound to one kubeconfig, with helm's state in its own directories."""

    kubeconfig: Path
    kubectl_bin: Path
    helm_bin: Path
    helm_home: Path

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
            env[var] = str(self.helm_home / var.lower())
        return env

    def _run(
        self, argv: list[str], *, stdin: str | None, check: bool, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            argv,
            input=stdin,
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise CommandFailed(argv, result)
        return result

    def kubectl(
        self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return self._run([str(self.kubectl_bin), *args], stdin=stdin, check=check, timeout=timeout)

    def helm(
        self, *args: str, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        return self._run([str(self.helm_bin), *args], stdin=None, check=check, timeout=timeout)

    # -- objects ---------------------------------------------------------------------------

    def get(self, *args: str) -> Obj:
        out = self.kubectl("get", *args, "-o", "json").stdout
        doc: Obj = json.loads(out)
        return doc

    def items(self, *args: str) -> list[Obj]:
        items: list[Obj] = self.get(*args)["items"]
        return items

    def create(self, *objs: Mapping[str, Any], namespace: str | None = None) -> None:
        ns = ["-n", namespace] if namespace else []
        doc = {"apiVersion": "v1", "kind": "List", "items": list(objs)}
        self.kubectl("create", *ns, "-f", "-", stdin=json.dumps(doc))

    def pods(self, namespace: str, selector: str | None = None) -> list[Obj]:
        sel = ["-l", selector] if selector else []
        return self.items("pods", "-n", namespace, *sel)

    # -- waiting ---------------------------------------------------------------------------

    def wait_for(
        self,
        what: str,
        probe: Callable[[], T | None],
        *,
        timeout: float = _WAIT_S,
        state: Callable[[], str] | None = None,
    ) -> T:
        """Poll ``probe`` until it returns a value; fail naming ``what`` and the last state."""
        deadline = time.monotonic() + timeout
        while True:
            value = probe()
            if value is not None and value is not False:
                return value
            if time.monotonic() > deadline:
                seen = state() if state else ""
                raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n{seen}")
            time.sleep(_POLL_S)

    def wait_running(self, namespace: str, count: int, selector: str | None = None) -> list[Obj]:
        """Exactly ``count`` pods, every one Running and Ready, none terminating."""

        def probe() -> list[Obj] | None:
            pods = self.pods(namespace, selector)
            live = [p for p in pods if "deletionTimestamp" not in p["metadata"]]
            ok = len(pods) == count and all(_running_ready(p) for p in live)
            return live if ok else None

        return self.wait_for(
            f"{count} Running pods in {namespace} ({selector or 'all'})",
            probe,
            state=lambda: _describe_pods(self.pods(namespace, selector)),
        )

    def wait_unschedulable(
        self, namespace: str, count: int, selector: str | None = None
    ) -> list[Obj]:
        """``count`` pods the scheduler has tried and could not place."""

        def probe() -> list[Obj] | None:
            pods = self.pods(namespace, selector)
            stuck = [p for p in pods if unschedulable_message(p) is not None]
            return stuck if len(pods) == count and len(stuck) == count else None

        return self.wait_for(
            f"{count} unschedulable pods in {namespace}",
            probe,
            state=lambda: _describe_pods(self.pods(namespace, selector)),
        )

    def wait_gone(self, kind: str, namespace: str, selector: str) -> None:
        self.wait_for(
            f"no {kind} left in {namespace} ({selector})",
            lambda: not self.items(kind, "-n", namespace, "-l", selector),
            state=lambda: self.kubectl("get", kind, "-n", namespace, "-l", selector).stdout,
        )

    # -- nodes -----------------------------------------------------------------------------

    def add_nodes(self, *specs: NodeSpec) -> None:
        """Create simulated nodes and wait until the scheduler may use them."""
        self.create(*(node_manifest(s) for s in specs))
        names = {s.name for s in specs}

        def probe() -> bool:
            nodes = [n for n in self.items("nodes") if n["metadata"]["name"] in names]
            return len(nodes) == len(names) and all(_schedulable(n) for n in nodes)

        self.wait_for(
            f"nodes {sorted(names)} Ready",
            probe,
            state=lambda: self.kubectl("get", "nodes", "-o", "wide").stdout,
        )
        dra = [s for s in specs if s.pcie_roots]
        if dra:
            uids = {n["metadata"]["name"]: n["metadata"]["uid"] for n in self.items("nodes")}
            self.create(*(resource_slice_manifest(s, uids[s.name]) for s in dra))

    def delete_nodes(self, names: Iterable[str]) -> None:
        names = list(names)
        if names:
            self.kubectl("delete", "node", *names, "--ignore-not-found", "--wait=false")


def _running_ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status", {})
    ready = any(
        c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", [])
    )
    return status.get("phase") == "Running" and ready


def _schedulable(node: Mapping[str, Any]) -> bool:
    ready = any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in node.get("status", {}).get("conditions", [])
    )
    # The node controller lifts its not-ready taint a moment after kwok reports Ready.
    taints = node.get("spec", {}).get("taints") or []
    return ready and not any(t["key"].startswith("node.kubernetes.io/") for t in taints)


class Nodes:
    """Simulated nodes of one test: names made unique by a suffix, deleted after the test."""

    def __init__(self, kube: Kube) -> None:
        self._kube = kube
        self._tag = secrets.token_hex(2)
        self.names: list[str] = []

    def add(self, *specs: NodeSpec) -> list[str]:
        """Create the nodes, wait until they take pods, and return their names."""
        first = len(self.names)
        named = [replace(s, name=f"{s.name}-{self._tag}-{first + i}") for i, s in enumerate(specs)]
        self.names += [s.name for s in named]
        self._kube.add_nodes(*named)
        return [s.name for s in named]

    def remove_all(self) -> None:
        self._kube.delete_nodes(self.names)
        self.names = []
