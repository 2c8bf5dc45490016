"""Fixtures of the cluster tests: one control plane per session, a namespace and nodes per test."""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator

import pytest

from tests.cluster.controlplane import REPO, ControlPlane, ControlPlaneError
from tests.cluster.kube import Kube, Nodes, device_class_manifest
from tests.cluster.lws import LwsController

_TOOLS_BIN = REPO / ".tools" / "bin"


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    plane = ControlPlane(tmp_path_factory.mktemp("cluster"))
    try:
        plane.start()
    except ControlPlaneError as exc:
        pytest.fail(f"control plane did not start: {exc}", pytrace=False)
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def kube(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Kube:
    for tool in ("kubectl", "helm"):
        if not (_TOOLS_BIN / tool).is_file():
            pytest.fail(f"{_TOOLS_BIN / tool} is missing; run scripts/setup-tools", pytrace=False)
    return Kube(
        kubeconfig=control_plane.kubeconfig,
        kubectl_bin=_TOOLS_BIN / "kubectl",
        helm_bin=_TOOLS_BIN / "helm",
        helm_home=tmp_path_factory.mktemp("helm"),
    )


@pytest.fixture(scope="session")
def lws(
    control_plane: ControlPlane, kube: Kube, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LwsController]:
    """The LeaderWorkerSet controller and its webhooks, from the first test that asks for
    them to the end of the session (its pod webhooks see only pods of a LeaderWorkerSet)."""
    controller = LwsController(kube, tmp_path_factory.mktemp("lws"), control_plane.tools)
    try:
        controller.start()
    except ControlPlaneError as exc:
        pytest.fail(f"LeaderWorkerSet controller did not start: {exc}", pytrace=False)
    try:
        yield controller
    finally:
        controller.stop()


@pytest.fixture(autouse=True)
def _components_stay_up(request: pytest.FixtureRequest) -> Iterator[None]:
    # A component that died mid-test explains every later failure; name it at once.
    yield
    for name in ("control_plane", "lws"):
        if name in request.fixturenames:
            request.getfixturevalue(name).check_alive()


def _slug(text: str, size: int) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:size].strip("-")


@pytest.fixture
def namespace(kube: Kube, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace named after the test; deleted (without waiting) afterwards."""
    name = f"{_slug(request.node.name.removeprefix('test_'), 50)}-{secrets.token_hex(3)}"
    kube.kubectl("create", "namespace", name)
    yield name
    kube.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")


@pytest.fixture
def nodes(kube: Kube) -> Iterator[Nodes]:
    pool = Nodes(kube)
    yield pool
    pool.remove_all()


@pytest.fixture(scope="session")
def gpu_device_class(kube: Kube) -> Iterator[str]:
    """NVIDIA's DRA DeviceClass (`gpu.nvidia.com`), as its driver's chart installs it."""
    manifest = device_class_manifest()
    kube.create(manifest)
    yield str(manifest["metadata"]["name"])
    kube.kubectl("delete", "deviceclass", manifest["metadata"]["name"], "--ignore-not-found")


@pytest.fixture(scope="session")
def monitoring_crds(control_plane: ControlPlane, kube: Kube) -> None:
    """The CRDs of the chart's optional objects (KEDA, Prometheus Operator, LeaderWorkerSet,
    InferencePool), from the Go modules cluster-setup unpacked."""
    crd_dir = control_plane.tools / "crds"
    files = sorted(crd_dir.glob("*/*.yaml"))
    if not files:
        pytest.fail(f"no CRDs under {crd_dir}; run scripts/cluster-setup", pytrace=False)
    # Server-side apply: KEDA's CRDs are larger than the client-side apply annotation allows.
    args = [a for f in files for a in ("-f", str(f))]
    kube.kubectl("apply", "--server-side", *args)
    kube.kubectl("wait", "--for=condition=Established", "--timeout=60s", *args)
