"""The model configs the chart ships (values.yaml and values-examples/*.yaml `models`) are
valid for the worker: its JSON Schema (the single source of the shape) and its read-time
rules, so chart and worker cannot drift apart."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
import yaml

from tests.chart._render import CHART, EXAMPLE_FILES, REPO

SCHEMA = REPO / "schemas" / "model-config.schema.json"


def _shipped() -> list[tuple[str, str, dict[str, Any]]]:
    out = []
    for path in [CHART / "values.yaml", *EXAMPLE_FILES]:
        values = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        for name, config in sorted((values.get("models") or {}).items()):
            if config is not None:  # null removes a default model from a release
                out.append((str(path.relative_to(REPO)), name, config))
    return out


_SHIPPED = _shipped()
_IDS = [f"{source}:{name}" for source, name, _ in _SHIPPED]


def test_chart_and_examples_ship_model_configs() -> None:
    sources = {source for source, _, _ in _SHIPPED}
    assert "chart/values.yaml" in sources
    assert len(sources) >= 4


@pytest.mark.parametrize(("source", "name", "config"), _SHIPPED, ids=_IDS)
def test_shipped_model_config_matches_the_worker_schema(
    source: str, name: str, config: dict[str, Any]
) -> None:
    if not SCHEMA.exists():
        pytest.skip(f"{SCHEMA.relative_to(REPO)} is not written yet")
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text(encoding="utf-8")))
    problems = [f"{e.json_path}: {e.message}" for e in validator.iter_errors(config)]
    assert problems == [], f"{source}: models.{name}"


@pytest.mark.parametrize(("source", "name", "config"), _SHIPPED, ids=_IDS)
def test_shipped_model_config_passes_the_worker_read_time_rules(
    source: str, name: str, config: dict[str, Any]
) -> None:
    config_module = pytest.importorskip("sie_worker.config.files.reader")
    parsed = config_module.parse_config(config, source=f"{source}:models.{name}")
    assert parsed.sie_id == config["sie_id"]
    assert "default" in parsed.profiles


def test_values_schema_is_draft_2020_12_with_descriptions_everywhere() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    missing: list[str] = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for key, sub in (node.get("properties") or {}).items():
                if "description" not in sub:
                    missing.append(f"{path}.{key}")
                walk(sub, f"{path}.{key}")
            for key in ("$defs", "additionalProperties", "items"):
                if isinstance(node.get(key), dict):
                    walk(node[key], f"{path}[{key}]")
            for key, sub in (node.get("$defs") or {}).items():
                walk(sub, f"{path}.$defs.{key}")

    walk(schema, "$")
    assert missing == []
