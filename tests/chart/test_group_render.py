"""Groups of nodes and InferencePools, rendered: the chart's group width rule agrees with the
worker's (``model_width``, ``GROUP_PORT_BASE``), and the LeaderWorkerSet and InferencePool of
the examples pass kubeconform against the schemas pinned in tools/schema-sources.txt."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from sie_worker.config.widths import model_width
from sie_worker.worker.launcher.ranks import GROUP_PORT_BASE

from tests.chart._render import EXAMPLES, REPO, helm, of_kind, render

pytestmark = pytest.mark.chart

GROUP = EXAMPLES / "h100-2x8-group.yaml"
POOL = EXAMPLES / "inference-pool.yaml"
_MODEL = "llama-3.1-405b-instruct-fp8"
_K8S_VERSION = "1.36.3"  # scripts/lib.sh K8S_SCHEMA_VERSION


def _group_render(tensor: int, stages: int, nodes: int) -> subprocess.CompletedProcess[str]:
    # --set escapes the dots of the model's file name; the rest of its config stays.
    loadtime = "models." + _MODEL.replace(".", "\\.") + ".profiles.default.adapter_options.loadtime"
    return helm(
        "template", "sie", str(REPO / "chart"), "-n", "sie", "-f", str(GROUP),
        "--set", f"workers.pools.h100-2x8.gpu.nodes={nodes}",
        "--set", f"{loadtime}.tensor_parallel_size={tensor}",
        "--set", f"{loadtime}.pipeline_parallel_size={stages}",
        check=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("tensor", "stages", "nodes"),
    [(8, 2, 2), (8, 1, 2), (4, 4, 2), (8, 3, 3), (8, 2, 3)],
)
def test_a_group_model_renders_exactly_when_its_worker_width_spans_the_group(
    tensor: int, stages: int, nodes: int
) -> None:
    done = _group_render(tensor, stages, nodes)
    spans = model_width(tensor, stages) == nodes * 8
    assert (done.returncode == 0) is spans, done.stderr
    width = model_width(tensor, stages)
    if width <= 8:  # fits one pod: not a group model, so the group pins none
        assert "workers.pools.h100-2x8.pinnedModels pins none" in done.stderr
    elif not spans:
        assert f"has width {width}" in done.stderr
        assert f"workers.pools.h100-2x8.gpu.nodes = {nodes} nodes" in done.stderr


def test_the_group_rank_port_is_open_where_every_rank_computes_it() -> None:
    [policy] = [
        p for p in of_kind(render(GROUP), "NetworkPolicy") if "h100-2x8" in p["metadata"]["name"]
    ]
    peers = [
        r
        for r in policy["spec"]["ingress"]
        if "podSelector" in r["from"][0]
        and "sie-workers/pool" in r["from"][0]["podSelector"].get("matchLabels", {})
    ]
    ports = [p["port"] for rule in peers for p in rule["ports"]]
    # The example pins its group model first: index 0.
    assert GROUP_PORT_BASE in ports


def _kubeconform(docs: list[dict[str, Any]], tmp_path: Path) -> str:
    binary = REPO / ".tools" / "bin" / "kubeconform"
    schemas = REPO / ".tools" / "k8s-schemas"
    if not binary.exists() or not (schemas / "crds").is_dir():
        pytest.skip("kubeconform and its schemas come from scripts/setup-tools")
    manifest = tmp_path / "render.yaml"
    manifest.write_text(yaml.safe_dump_all(docs))
    done = subprocess.run(
        [
            str(binary), "-strict", "-summary", "-output", "text",
            "-kubernetes-version", _K8S_VERSION,
            "-schema-location", str(schemas),
            "-schema-location",
            str(schemas) + "/crds/{{.Group}}/{{.ResourceKind}}_{{.ResourceAPIVersion}}.json",
            str(manifest),
        ],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.parametrize(("example", "kind"), [(GROUP, "LeaderWorkerSet"), (POOL, "InferencePool")])
def test_the_example_kind_passes_kubeconform_with_its_pinned_crd_schema(
    example: Path, kind: str, tmp_path: Path
) -> None:
    docs = of_kind(render(example), kind)
    assert len(docs) == 1
    summary = _kubeconform(docs, tmp_path)
    assert "Valid: 1, Invalid: 0, Errors: 0, Skipped: 0" in summary


def test_kubeconform_refuses_a_leaderworkerset_the_api_server_would(tmp_path: Path) -> None:
    [lws] = of_kind(render(GROUP), "LeaderWorkerSet")
    lws["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "RestartAlways"
    binary = REPO / ".tools" / "bin" / "kubeconform"
    if not binary.exists():
        pytest.skip("kubeconform comes from scripts/setup-tools")
    manifest = tmp_path / "bad.yaml"
    manifest.write_text(yaml.safe_dump(lws))
    schemas = REPO / ".tools" / "k8s-schemas"
    done = subprocess.run(
        [
            str(binary), "-strict", "-output", "text",
            "-schema-location",
            str(schemas) + "/crds/{{.Group}}/{{.ResourceKind}}_{{.ResourceAPIVersion}}.json",
            str(manifest),
        ],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert "/spec/leaderWorkerTemplate/restartPolicy" in done.stdout
