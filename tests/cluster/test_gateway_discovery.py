"""The gateway against a real API server: EndpointSlice discovery, scale to zero and back,
and a ServiceAccount that can read endpointslices and nothing else.

The chart is installed with the gateway; the gateway itself runs on this machine with the
token of the chart's gateway ServiceAccount (``kubectl create token``) and the pools file
from the chart's ConfigMap, as its pod would. The pool's pods are kwok's, so nothing answers
at their addresses: the gateway runs in a network namespace of the test's own
(:mod:`tests.cluster.netns`) where kwok's pod range is local and the pool's router port leads
to a real router and worker (fake engine) on this machine. So the EndpointSlice that the
controller builds from the pod leads to a pod that answers, and no packet leaves the machine.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import yaml

from tests.cluster import netns
from tests.cluster.controlplane import ControlPlane
from tests.cluster.kube import Kube, Nodes, NodeSpec
from tests.cluster.test_chart_install import install, release_name
from tests.support import loopback
from tests.support.gateway_fixtures import GatewayProcess, PodProcess
from tests.support.ports import free_port
from tests.support.worker_fixtures import fake_model, wait_until

pytestmark = pytest.mark.cluster

MODEL = fake_model("org/small")


def _token_kubeconfig(
    kube: Kube, plane: ControlPlane, namespace: str, account: str, path: Path
) -> Path:
    admin = json.loads(plane.kubeconfig.read_text())
    token = kube.kubectl(
        "create", "token", account, "-n", namespace, "--duration=1h"
    ).stdout.strip()
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": admin["clusters"],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [
            {
                "name": account,
                "context": {
                    "cluster": admin["clusters"][0]["name"],
                    "user": account,
                    "namespace": namespace,
                },
            }
        ],
        "current-context": account,
    }
    path.write_text(json.dumps(doc))
    return path


def _as(kube: Kube, kubeconfig: Path, *args: str) -> Any:
    return kube._run(
        [str(kube.kubectl_bin), f"--kubeconfig={kubeconfig}", *args],
        stdin=None,
        check=False,
        timeout=60,
    )


def test_gateway_discovers_pods_through_endpointslices_with_only_that_permission(
    kube: Kube,
    control_plane: ControlPlane,
    namespace: str,
    nodes: Nodes,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    start_pod: Callable[..., PodProcess],
    start_gateway: Callable[..., GatewayProcess],
) -> None:
    why = netns.NetNamespace.available()
    if why is not None:
        message = f"needs a network namespace of its own: {why}"
        if os.environ.get("CI") == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    release = release_name("gw")
    port = free_port()
    # The pool's router port is where the real pod below listens.
    install(kube, release, namespace, sets=[f"workers.common.port={port}", "gateway.replicas=1"])
    nodes.add(NodeSpec.gpu("l4", 1), NodeSpec("cpu"))
    deployment = f"{release}-sie-workers-l4-default"
    pod = start_pod([MODEL], port=port)
    ns = netns.NetNamespace()
    request.addfinalizer(ns.stop)
    ns.start()
    api_port = int(
        urlsplit(
            json.loads(control_plane.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
        ).port
        or 443
    )
    ns.bridge_out(api_port, api_port, listen_host="127.0.0.1")
    ns.bridge_out(port, port)  # every pod address of kwok's range, inside, is this router
    gateway_port = free_port()
    ns.bridge_in(gateway_port)

    gateway_name = f"{release}-sie-workers-gateway"
    config = kube.get("configmap", gateway_name, "-n", namespace)
    pools = yaml.safe_load(config["data"]["pools.yaml"])
    assert pools[0]["service"] == deployment
    kubeconfig = _token_kubeconfig(
        kube, control_plane, namespace, gateway_name, tmp_path / "gw.kubeconfig"
    )

    # Minimal RBAC: endpointslices, nothing else (not pods, not secrets).
    assert _as(kube, kubeconfig, "get", "endpointslices", "-n", namespace).returncode == 0
    for forbidden in (("get", "pods"), ("get", "secrets"), ("get", "services"), ("watch", "pods")):
        done = _as(kube, kubeconfig, "auth", "can-i", *forbidden, "-n", namespace)
        assert done.stdout.strip() == "no", forbidden
    denied = _as(kube, kubeconfig, "get", "pods", "-n", namespace)
    assert denied.returncode != 0
    assert "Forbidden" in denied.stderr
    denied = _as(kube, kubeconfig, "get", "secrets", "-n", namespace)
    assert "Forbidden" in denied.stderr
    other = _as(kube, kubeconfig, "get", "endpointslices", "-n", "default")
    assert "Forbidden" in other.stderr

    gateway = start_gateway(
        pools,
        port=gateway_port,
        wrapper=ns.prefix(),
        env={
            "KUBECONFIG": str(kubeconfig),
            "SIE_GATEWAY_NAMESPACE": namespace,
            "SIE_GATEWAY_HOLD_S": "60",
        },
    )

    def health() -> dict[str, Any]:
        return loopback.get(gateway.url + "/health", timeout=5).json()

    def pod_names() -> list[str]:
        return [p["metadata"]["name"] for p in kube.pods(namespace, "sie-workers/pool=l4")]

    def seen(count: int) -> Any:
        return health()["cluster"]["worker_count"] == count or None

    def state() -> str:
        slices = kube.items("endpointslices", "-n", namespace)
        endpoints = [(s["metadata"]["name"], s.get("endpoints"), s.get("ports")) for s in slices]
        return f"health: {health()}\nslices: {endpoints}\ngateway log:\n{gateway.logs()[-3000:]}"

    kube.wait_for("the pool's pod running", lambda: pod_names() or None)
    kube.wait_for("the gateway to see the pod", lambda: seen(1), state=state)
    [worker] = health()["workers"]
    assert worker["name"] == pod_names()[0]
    [address] = {
        e["addresses"][0]
        for s in kube.items("endpointslices", "-n", namespace)
        for e in s.get("endpoints") or []
        if e["targetRef"]["name"] == worker["name"]
    }
    assert worker["url"] == f"http://{address}:{port}"
    with gateway.client() as client:
        served = client.post(
            "/v1/completions",
            json={"model": "org/small", "prompt": "hi", "max_tokens": 2},
            headers={"X-SIE-MACHINE-PROFILE": "l4"},
        )
    assert served.status_code == 200, served.text
    assert served.headers["x-sie-pod"] == worker["name"]

    # Scaled to zero: the EndpointSlice empties, the pool has no worker, requests are held.
    kube.kubectl("scale", "deployment", deployment, "-n", namespace, "--replicas=0")
    wait_until(lambda: health()["workers"] == [], timeout=60)
    assert health()["status"] == "degraded"
    result: list[httpx.Response] = []

    def send() -> None:
        with gateway.client() as client:
            result.append(
                client.post(
                    "/v1/completions",
                    json={"model": "org/small", "prompt": "again", "max_tokens": 2},
                    headers={"X-SIE-Pool": "l4"},
                )
            )

    thread = threading.Thread(target=send)
    thread.start()
    try:
        pending = 'sie_gateway_pending_requests{bundle="default",pool="l4"}'
        wait_until(lambda: gateway.metric(pending) == 1, timeout=30)
        # ... and back: the new pod's endpoint turns ready and the held request is served.
        kube.kubectl("scale", "deployment", deployment, "-n", namespace, "--replicas=1")
    finally:
        thread.join(timeout=90)
    assert result[0].status_code == 200, result[0].text
    assert result[0].headers["x-sie-pod"] in pod_names()
    assert health()["cluster"]["worker_count"] == 1
    assert pod.ready()
    assert "Forbidden" not in gateway.logs()
    # Read-only: not even the endpointslices it watches can be changed.
    deleted = _as(kube, kubeconfig, "delete", "endpointslices", "--all", "-n", namespace)
    assert "Forbidden" in deleted.stderr
