"""chart/README.md documents every value of chart/values.yaml, and its table is current."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from tests.chart._render import CHART


def _values_doc() -> ModuleType:
    spec = importlib.util.spec_from_file_location("values_doc", CHART / "hack" / "values_doc.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_every_values_key_has_a_doc_comment() -> None:
    _, undocumented = _values_doc().parse_values(CHART / "values.yaml")
    assert undocumented == []


def test_readme_values_table_matches_values_yaml() -> None:
    assert _values_doc().check(CHART) == []


def test_values_yaml_points_editors_at_the_schema() -> None:
    first = (CHART / "values.yaml").read_text(encoding="utf-8").splitlines()[0]
    assert first == "# yaml-language-server: $schema=values.schema.json"


def test_readme_keeps_the_sections_other_docs_link_to() -> None:
    headings = {
        line
        for line in (CHART / "README.md").read_text(encoding="utf-8").splitlines()
        if line.startswith("## ")
    }
    assert {
        "## Sizing",
        "## Sizing shmSize and memory for a device group",
        "## How widths, pools and startup_timeout_s relate",
        "## Values",
    } <= headings


def test_doc_generator_reports_an_undocumented_key(tmp_path: Path) -> None:
    (tmp_path / "values.yaml").write_text(
        "# -- Documented.\na: 1\nb:\n  # -- Documented child.\n  c: true\n  d: x\n",
        encoding="utf-8",
    )
    rows, undocumented = _values_doc().parse_values(tmp_path / "values.yaml")
    assert [(r.key, r.type, r.default) for r in rows] == [
        ("a", "int", "`1`"),
        ("b.c", "bool", "`true`"),
    ]
    assert undocumented == ["b.d"]


def test_doc_generator_reports_a_stale_table(tmp_path: Path) -> None:
    doc = _values_doc()
    (tmp_path / "values.yaml").write_text("# -- (list) Things.\nthings: []\n", encoding="utf-8")
    (tmp_path / "README.md").write_text(f"# x\n{doc.BEGIN}\n| old |\n{doc.END}\n", encoding="utf-8")
    assert doc.check(tmp_path) == [
        "README.md: values table is stale; run python chart/hack/values_doc.py"
    ]


def test_doc_generator_check_command_passes_on_the_committed_readme() -> None:
    readme = (CHART / "README.md").read_text(encoding="utf-8")
    assert _values_doc().main(["--check"]) == 0
    assert (CHART / "README.md").read_text(encoding="utf-8") == readme
