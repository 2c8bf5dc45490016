"""The chart's dashboards are generated (chart/hack/dashboards.py) and the files are current."""

from __future__ import annotations

import importlib.util
import json
import sys
from types import ModuleType

from tests.chart._render import CHART


def _dashboards() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dashboards", CHART / "hack" / "dashboards.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_dashboard_files_are_what_the_generator_writes() -> None:
    module = _dashboards()
    for name in module.DASHBOARDS:
        path = CHART / "dashboards" / f"{name}.json"
        assert path.read_text() == module.render(name), (
            f"{path} is stale: run .venv/bin/python chart/hack/dashboards.py"
        )


def test_the_check_mode_fails_on_a_stale_file() -> None:
    module = _dashboards()
    assert module.main(["--check"]) == 0
    original = module.render
    module.render = lambda name: original(name).replace("SIE fleet", "SIE fleet!")
    try:
        assert module.main(["--check"]) == 1
    finally:
        module.render = original


def test_every_panel_selects_the_dashboards_release_and_has_a_description() -> None:
    for path in sorted((CHART / "dashboards").glob("*.json")):
        board = json.loads(path.read_text())
        constants = {v["name"] for v in board["templating"]["list"] if v["type"] == "constant"}
        assert constants == {"namespace", "release"}
        for panel in board["panels"]:
            assert panel["description"], (path.name, panel["title"])
            for target in panel["targets"]:
                expr = target["expr"]
                selectors = expr.count("{")
                assert expr.count('namespace="$namespace",release="$release"') == selectors
