"""Renders of every values example: lint, the issue's done-when shapes, and rolling on change."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from sie_worker.config.widths import model_width

from tests.chart._render import CHART, EXAMPLE_FILES, EXAMPLES, helm, of_kind, render

pytestmark = pytest.mark.chart

L4_4X = EXAMPLES / "l4-4x.yaml"


def _deployment(docs: list[dict[str, Any]], pool: str) -> dict[str, Any]:
    [dep] = [
        d
        for d in of_kind(docs, "Deployment")
        if d["metadata"]["labels"].get("sie-workers/pool") == pool
    ]
    return dep


def _pod_template(workload: dict[str, Any]) -> dict[str, Any]:
    """A Deployment's pod template, or a LeaderWorkerSet's (every rank's) one."""
    if workload["kind"] == "LeaderWorkerSet":
        return workload["spec"]["leaderWorkerTemplate"]["workerTemplate"]  # type: ignore[no-any-return]
    return workload["spec"]["template"]  # type: ignore[no-any-return]


def _containers(dep: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in _pod_template(dep)["spec"]["containers"]}


def _env(container: dict[str, Any]) -> dict[str, str | None]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


@pytest.mark.parametrize("example", EXAMPLE_FILES, ids=[f.stem for f in EXAMPLE_FILES])
def test_every_values_example_passes_helm_lint_strict(example: Path) -> None:
    done = helm("lint", "--strict", str(CHART), "-f", str(example), "-n", "sie", check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 chart(s) failed" in done.stdout


def test_seed_l4_4x_renders_one_worker_holding_four_gpus() -> None:
    dep = _deployment(render(L4_4X), "l4-4x")
    containers = _containers(dep)
    assert sorted(containers) == ["router", "worker-0"]
    worker = containers["worker-0"]
    assert worker["resources"]["requests"]["nvidia.com/gpu"] == 4
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert _env(worker)["SIE_DEVICES"] == "cuda:0,cuda:1,cuda:2,cuda:3"
    assert _env(containers["router"])["SIE_GPU_COUNT"] == "1"
    [shm] = [v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == "dshm"]
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "32Gi"}


def test_seed_l4_4x_without_device_group_renders_four_one_gpu_workers() -> None:
    docs = render(L4_4X, sets=["workers.pools.l4-4x.gpu.deviceGroup=false"])
    containers = _containers(_deployment(docs, "l4-4x"))
    workers = [containers[f"worker-{i}"] for i in range(4)]
    assert len(containers) == 5
    assert [w["resources"]["limits"]["nvidia.com/gpu"] for w in workers] == [1, 1, 1, 1]
    assert {_env(w)["SIE_DEVICES"] for w in workers} == {"cuda:0"}
    router = _env(containers["router"])
    assert router["SIE_GPU_COUNT"] == "4"
    assert router["SIE_WORKER_PORTS"] == "8081,8082,8083,8084"


def test_device_group_of_one_gpu_is_refused_by_the_schema() -> None:
    done = helm(
        "template",
        "sie",
        str(CHART),
        "--set-json",
        'workers.pools.l4.gpu={"count": 1, "deviceGroup": true}',
        check=False,
    )
    assert done.returncode != 0
    assert "/workers/pools/l4/gpu/count" in done.stderr
    assert "minimum: got 1, want 2" in done.stderr


def test_changing_a_model_config_changes_the_pod_template_checksum() -> None:
    def checksum(*set_json: str) -> str:
        dep = _deployment(render(set_json=set_json), "l4")
        return str(dep["spec"]["template"]["metadata"]["annotations"]["checksum/models"])

    before = checksum()
    after = checksum(
        "models.all-minilm-l6-v2.profiles.default.max_batch_tokens=8192",
    )
    assert before != after
    assert checksum() == before


def test_refusals_name_every_problem_at_once() -> None:
    done = helm(
        "template",
        "sie",
        str(CHART),
        "--set",
        "workers.pools.l4.shmSize=64Gi",
        "--set-json",
        'workers.pools.l4.bundles={"trtllm": {"minReplicas": 1, "maxReplicas": 1}}',
        check=False,
    )
    assert done.returncode != 0
    assert "invalid values (2 problems)" in done.stderr
    assert "workers.pools.l4.bundles.trtllm: unknown bundle" in done.stderr
    assert "worker memory limit 32Gi" in done.stderr
    assert "sizeLimit 64Gi" in done.stderr


@pytest.mark.parametrize("example", EXAMPLE_FILES, ids=[f.stem for f in EXAMPLE_FILES])
def test_every_example_pod_is_hardened_and_isolated(example: Path) -> None:
    docs = render(example)
    policies = [p["spec"]["podSelector"]["matchLabels"] for p in of_kind(docs, "NetworkPolicy")]
    workloads = of_kind(docs, "Deployment") + of_kind(docs, "LeaderWorkerSet")
    assert workloads
    for dep in workloads:
        name = dep["metadata"]["name"]
        template = _pod_template(dep)
        pod = template["spec"]
        labels = template["metadata"]["labels"]
        # Only the gateway holds a token: it watches EndpointSlices (its Role allows no more).
        gateway = labels["app.kubernetes.io/component"] == "gateway"
        assert pod["automountServiceAccountToken"] is gateway, name
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert any(sel.items() <= labels.items() for sel in policies), f"{name}: no NetworkPolicy"
        for c in pod["containers"]:
            sc = c["securityContext"]
            where = f"{name}/{c['name']}"
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["capabilities"]["drop"] == ["ALL"], where
            assert sc["runAsUser"] == 10001, where
    accounts = {a["metadata"]["name"]: a for a in of_kind(docs, "ServiceAccount")}
    assert set(accounts) == {"sie-sie-workers", "sie-sie-workers-gateway"}
    assert all(a["automountServiceAccountToken"] is False for a in accounts.values())


@pytest.mark.parametrize("example", EXAMPLE_FILES, ids=[f.stem for f in EXAMPLE_FILES])
def test_every_example_model_width_fits_a_pool_that_runs_sglang(example: Path) -> None:
    # The render-time rule, checked from the outside: a shipped width has a slot to go to.
    docs = render(example)
    widest = 0
    for dep in of_kind(docs, "Deployment") + of_kind(docs, "LeaderWorkerSet"):
        if dep["metadata"]["labels"].get("sie-workers/bundle", "default") == "default":
            continue
        # The slot's width from SIE_DEVICES: the same whether GPUs come from limits or claims;
        # a group's leader spans the devices of all its nodes.
        devices = _env(_containers(dep)["worker-0"])["SIE_DEVICES"] or ""
        nodes = int(dep["spec"].get("leaderWorkerTemplate", {}).get("size", 1))
        widest = max(widest, len(devices.split(",")) * nodes)
    [configmap] = [
        c for c in of_kind(docs, "ConfigMap") if c["metadata"]["name"].endswith("-models")
    ]
    for key, text in (configmap.get("data") or {}).items():
        loadtime = (
            yaml.safe_load(text)["profiles"]["default"]
            .get("adapter_options", {})
            .get("loadtime", {})
        )
        width = model_width(
            int(loadtime.get("tensor_parallel_size", 1)),
            int(loadtime.get("pipeline_parallel_size", 1)),
        )
        assert width == 1 or width <= widest, f"{key}: width {width} > {widest}"
