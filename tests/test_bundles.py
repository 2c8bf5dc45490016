"""Bundle coverage: every adapter a shipped or example model config names is served by an
image bundle, and the chart's bundles, their image tags and the Dockerfile targets agree."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.dockerfile_stages import parse_dockerfile
from tests.support.repo import ROOT, make_dry_run

CHART_VALUES = yaml.safe_load((ROOT / "chart" / "values.yaml").read_text())
_, STAGES = parse_dockerfile(ROOT / "Dockerfile")
TARGETS = {stage.name for stage in STAGES}
RELEASES = sorted((ROOT / "values-examples").glob("*.yaml"))
MODEL_FILES = sorted((ROOT / "values-examples" / "models").glob("*.yaml"))


def _bundle_packages(bundle: str) -> set[str]:
    """The Python packages of the bundle's lock, and llama-server where its image carries
    llama.cpp's binaries (built in the image, not a package)."""
    text = (ROOT / "requirements" / f"bundle-{bundle}.txt").read_text()
    found = {name.lower() for name in re.findall(r"^([A-Za-z0-9_.\-]+)==", text, re.MULTILINE)}
    copies = [c for s in STAGES if s.name == bundle for c in s.all("COPY")]
    if any("/opt/llama.cpp/bin" in c for c in copies):
        found.add("llama-server")
    return found


def _engine_package(adapter_path: str) -> str:
    """The package an adapter's engine runs on (architecture.md, Adapters)."""
    module = adapter_path.partition(":")[0]
    if module == "sie_server.adapters.sglang" or module.startswith("sie_server.adapters.sglang."):
        return "sglang"
    if module.startswith("sie_server.adapters.vllm."):
        return "vllm"
    if module.startswith("sie_server.adapters.llamacpp."):
        return "llama-server"
    if module == "sie_server.adapters.transformers":
        return "sentence-transformers"
    raise AssertionError(f"{adapter_path}: not an adapter of sie_server.adapters")


def _bundles_serving(adapter_path: str) -> list[str]:
    package = _engine_package(adapter_path)
    return [b for b in sorted(CHART_VALUES["workers"]["bundles"]) if package in _bundle_packages(b)]


def _merge(base: Any, override: Any) -> Any:
    """Helm's values merge: maps merge key by key, a null removes the key, the rest replaces."""
    if not isinstance(base, dict) or not isinstance(override, dict):
        return override
    out = dict(base)
    for key, value in override.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge(base.get(key), value)
    return out


def _adapter_paths(models: dict[str, Any] | None) -> dict[str, str]:
    """`{"<model>.<profile>": adapter_path}` of the configs that name one."""
    return {
        f"{name}.{profile}": body["adapter_path"]
        for name, config in (models or {}).items()
        if config
        for profile, body in (config.get("profiles") or {}).items()
        if body and body.get("adapter_path")
    }


def _all_adapter_paths() -> dict[str, str]:
    found = {f"chart/values.yaml:{k}": v for k, v in _adapter_paths(CHART_VALUES["models"]).items()}
    for release in RELEASES:
        models = (yaml.safe_load(release.read_text()) or {}).get("models")
        found |= {f"{release.name}:{k}": v for k, v in _adapter_paths(models).items()}
    for model in MODEL_FILES:
        config = yaml.safe_load(model.read_text())
        found |= {f"models/{model.name}:{k}": v for k, v in _adapter_paths({"": config}).items()}
    return found


ADAPTER_PATHS = _all_adapter_paths()


def test_the_shipped_and_example_models_name_adapters() -> None:
    assert ADAPTER_PATHS, "no adapter_path found in chart/values.yaml or values-examples/"
    assert any("chart/values.yaml" in where for where in ADAPTER_PATHS)


@pytest.mark.parametrize("where", sorted(ADAPTER_PATHS))
def test_every_adapter_is_served_by_a_bundle(where: str) -> None:
    adapter_path = ADAPTER_PATHS[where]
    assert _bundles_serving(adapter_path), (
        f"{where}: no image bundle carries {_engine_package(adapter_path)} for {adapter_path}"
    )


@pytest.mark.parametrize("adapter_path", sorted(set(ADAPTER_PATHS.values())))
def test_every_adapter_path_resolves(adapter_path: str) -> None:
    module, _, attr = adapter_path.partition(":")
    assert hasattr(importlib.import_module(module), attr), f"{adapter_path} does not import"


@pytest.mark.parametrize("release", RELEASES, ids=lambda p: p.name)
def test_each_release_can_serve_the_models_it_ships(release: Path) -> None:
    values = _merge(CHART_VALUES, yaml.safe_load(release.read_text()) or {})
    deployed = {
        bundle
        for pool in (values["workers"].get("pools") or {}).values()
        if pool and pool.get("enabled")
        for bundle in (pool.get("bundles") or {})
    }
    for where, adapter_path in _adapter_paths(values.get("models")).items():
        serving = set(_bundles_serving(adapter_path)) & deployed
        assert serving, (
            f"{release.name}: model {where} needs {adapter_path}, which none of the deployed "
            f"bundles {sorted(deployed)} serves"
        )


@pytest.mark.parametrize("bundle", sorted(CHART_VALUES["workers"]["bundles"]))
def test_every_chart_bundle_has_a_dockerfile_target(bundle: str) -> None:
    assert bundle in TARGETS, f"chart bundle {bundle} has no `FROM ... AS {bundle}` in Dockerfile"


def test_every_bundle_target_is_a_chart_bundle() -> None:
    targets = {s.name for s in STAGES if "SIE_BUNDLE" in s.env()}
    assert targets == set(CHART_VALUES["workers"]["bundles"])


@pytest.mark.parametrize("bundle", sorted(CHART_VALUES["workers"]["bundles"]))
def test_make_image_tags_what_the_chart_pulls(bundle: str) -> None:
    version = (ROOT / "VERSION").read_text().strip()
    common = CHART_VALUES["workers"]["common"]["image"]
    suffix = CHART_VALUES["workers"]["bundles"][bundle].get("tagSuffix", "")
    expected = f"{common['repository']}:{common.get('tag') or version}{suffix}"
    dry_run = make_dry_run("image", f"BUNDLE={bundle}")
    assert f"--target {bundle} " in dry_run
    assert f"-t {expected} " in dry_run + " ", dry_run
