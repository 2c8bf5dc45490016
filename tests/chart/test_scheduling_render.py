"""Renders of the scheduling values: where GPUs come from changes nothing else in the pod, the
claim templates the pods name are the ones rendered, and a template's name follows its spec."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from tests.chart._render import CHART, EXAMPLE_FILES, EXAMPLES, helm, of_kind, render

pytestmark = pytest.mark.chart

DRA_EXAMPLE = EXAMPLES / "l40s-8x-dra.yaml"
L4_4X = EXAMPLES / "l4-4x.yaml"
GPU = "nvidia.com/gpu"
COUNT_LABEL = "nvidia.com/gpu.count"


def _workers(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        d["metadata"]["name"]: d
        for d in of_kind(docs, "Deployment")
        if "sie-workers/pool" in d["metadata"]["labels"]
    }


def _without_gpu_source(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod spec minus what says where GPUs come from (limits, claims, resourceClaims)."""
    pod = copy.deepcopy(pod)
    pod.pop("resourceClaims", None)
    for container in pod["containers"]:
        resources = container.get("resources", {})
        resources.pop("claims", None)
        for kind in ("requests", "limits"):
            resources.get(kind, {}).pop(GPU, None)
    return pod


def _gpu_pools(docs: list[dict[str, Any]]) -> list[str]:
    labels = [d["metadata"]["labels"] for d in _workers(docs).values()]
    return sorted({m["sie-workers/pool"] for m in labels if m["sie-workers/gpu-type"] != "cpu"})


def _claim_templates(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {t["metadata"]["name"]: t for t in of_kind(docs, "ResourceClaimTemplate")}


@pytest.mark.parametrize("example", EXAMPLE_FILES, ids=[f.stem for f in EXAMPLE_FILES])
def test_claims_or_limits_give_every_example_pod_the_same_devices_shm_and_resources(
    example: Path,
) -> None:
    pools = _gpu_pools(render(example))

    def rendered(enabled: bool) -> list[dict[str, Any]]:
        flag = str(enabled).lower()
        return render(example, sets=[f"workers.pools.{p}.gpu.dra.enabled={flag}" for p in pools])

    with_limits, with_claims = rendered(False), rendered(True)
    limits, claims = _workers(with_limits), _workers(with_claims)
    templates = _claim_templates(with_claims)
    assert not _claim_templates(with_limits)
    assert limits.keys() == claims.keys()
    for name, dep in limits.items():
        pod, claimed = dep["spec"]["template"]["spec"], claims[name]["spec"]["template"]["spec"]
        # SIE_DEVICES, SIE_GPU_COUNT, shm, cpu/memory/ephemeral-storage: all identical.
        assert _without_gpu_source(pod) == _without_gpu_source(claimed), name
        if dep["metadata"]["labels"]["sie-workers/gpu-type"] == "cpu":
            assert "resourceClaims" not in claimed, name
            continue
        workers = [c for c in pod["containers"] if c["name"].startswith("worker-")]
        per_worker = [int(c["resources"]["limits"][GPU]) for c in workers]
        [claim] = claimed["resourceClaims"]
        template = templates[claim["resourceClaimTemplateName"]]
        requests = template["spec"]["spec"]["devices"]["requests"]
        # The claim asks for exactly the GPUs the limits would have: per request, per container.
        assert [r["exactly"]["count"] for r in requests] == per_worker, name
        asked = {c["name"]: c["resources"].get("claims") for c in claimed["containers"]}
        assert asked.pop("router") is None, name
        assert list(asked.values()) == [[{"name": "gpus", "request": r["name"]}] for r in requests]


def test_every_pod_naming_a_claim_template_names_one_rendered_beside_it() -> None:
    bundles = json.dumps(
        {b: {"minReplicas": 1, "maxReplicas": 1} for b in ("sglang", "sglang-cu130")}
    )
    docs = render(DRA_EXAMPLE, set_json=[f"workers.pools.l40s-4x.bundles={bundles}"])
    templates = _claim_templates(docs)
    named = {
        c["resourceClaimTemplateName"]
        for d in _workers(docs).values()
        for c in d["spec"]["template"]["spec"].get("resourceClaims", [])
    }
    assert len(named) == 2
    assert named == set(templates)


def test_a_claim_template_is_renamed_when_its_spec_changes_and_only_then() -> None:
    def name(*sets: str) -> str:
        [template] = of_kind(render(DRA_EXAMPLE, sets=list(sets)), "ResourceClaimTemplate")
        return str(template["metadata"]["name"])

    base = name()
    assert base.startswith("sie-sie-workers-l40s-4x-sglang-")
    assert name("workers.pools.l40s-4x.gpu.dra.matchAttribute=gpu.nvidia.com/nvlinkDomain") != base
    assert name("workers.pools.l40s-4x.gpu.count=8") != base
    # Values that do not reach the template's spec keep the name (no needless pod roll).
    assert name("workers.pools.l40s-4x.shmSize=16Gi") == base
    assert name("workers.pools.l40s-4x.gpu.nodeGpuCounts={4}") == base


def test_every_example_gpu_pod_prefers_exact_fits_or_requires_its_node_gpu_counts() -> None:
    for example in EXAMPLE_FILES:
        for name, dep in _workers(render(example)).items():
            pod = dep["spec"]["template"]["spec"]
            node = pod["affinity"].get("nodeAffinity", {})
            if dep["metadata"]["labels"]["sie-workers/gpu-type"] == "cpu":
                assert node == {}, name
                continue
            devices = [e["value"] for c in pod["containers"] for e in c.get("env", [])
                       if e["name"] == "SIE_DEVICES"]  # fmt: skip
            gpus = sum(len(d.split(",")) for d in devices)
            required = node.get("requiredDuringSchedulingIgnoredDuringExecution")
            if required:
                for term in required["nodeSelectorTerms"]:
                    [rule] = [e for e in term["matchExpressions"] if e["key"] == COUNT_LABEL]
                    assert all(int(v) >= gpus for v in rule["values"]), name
                assert "preferredDuringSchedulingIgnoredDuringExecution" not in node, name
            else:
                [preferred] = node["preferredDuringSchedulingIgnoredDuringExecution"]
                assert preferred["preference"]["matchExpressions"] == [
                    {"key": COUNT_LABEL, "operator": "In", "values": [str(gpus)]}
                ], name


def test_the_dra_example_renders_with_helms_built_in_api_versions() -> None:
    # scripts/test renders every example with plain `helm template`: Helm's built-in API set
    # (Kubernetes' client libraries) has resource.k8s.io/v1, so the example needs no flag.
    done = helm("template", "sie", str(CHART), "-f", str(DRA_EXAMPLE), check=False)
    assert done.returncode == 0, done.stderr
    assert "kind: ResourceClaimTemplate" in done.stdout


def test_helm_template_refuses_a_match_attribute_without_a_domain() -> None:
    # (The refusal of a cluster without resource.k8s.io/v1 needs a cluster's discovery or
    # helm-unittest's capabilities: chart/tests/validate-values_test.yaml.)
    sets = json.dumps({"enabled": True, "matchAttribute": "pcieRoot"})
    done = helm(
        "template", "sie", str(CHART), "-f", str(L4_4X),
        "--set-json", f"workers.pools.l4-4x.gpu.dra={sets}",
        check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert 'workers.pools.l4-4x.gpu.dra.matchAttribute: "pcieRoot" has no domain' in done.stderr
    assert "write resource.kubernetes.io/pcieRoot" in done.stderr
