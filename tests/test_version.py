"""One version: VERSION, the package's __version__ and the chart's version/appVersion agree,
and scripts/version.py writes VERSION into the others."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.repo import ROOT, load_script

version = load_script("version")
VERSION = (ROOT / "VERSION").read_text().strip()


def test_version_file_holds_a_semantic_version() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?", VERSION), VERSION


def test_package_version_is_the_version_file() -> None:
    from sie_worker import _version

    assert _version.__version__ == VERSION


def test_chart_version_and_app_version_are_the_version_file() -> None:
    chart = yaml.safe_load((ROOT / "chart" / "Chart.yaml").read_text())
    assert str(chart["version"]) == VERSION
    assert str(chart["appVersion"]) == VERSION


def test_changelog_has_a_section_for_the_version_or_unreleased_work() -> None:
    headings = re.findall(r"^## \[([^\]]+)\]", (ROOT / "CHANGELOG.md").read_text(), re.MULTILINE)
    assert headings, "CHANGELOG.md has no `## [...]` section"
    assert headings[0] in {"Unreleased", VERSION}, headings


def test_version_check_passes_on_the_repo() -> None:
    result = subprocess.run(
        [sys.executable, "scripts/version.py"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == VERSION


@pytest.fixture
def repo_copy(tmp_path: Path) -> Path:
    for rel in ("VERSION", "chart/Chart.yaml", "worker/src/sie_worker/_version.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    return tmp_path


def test_set_writes_every_place_and_keeps_the_rest(repo_copy: Path) -> None:
    before = (repo_copy / "chart" / "Chart.yaml").read_text()
    version.sync(repo_copy, "2.3.4-rc.1")
    assert version.check(repo_copy) == []
    chart_text = (repo_copy / "chart" / "Chart.yaml").read_text()
    chart = yaml.safe_load(chart_text)
    assert (chart["version"], chart["appVersion"]) == ("2.3.4-rc.1", "2.3.4-rc.1")
    assert (
        '__version__ = "2.3.4-rc.1"'
        in (repo_copy / "worker" / "src" / "sie_worker" / "_version.py").read_text()
    )
    # Only the two version lines changed.
    changed = [
        a for a, b in zip(before.splitlines(), chart_text.splitlines(), strict=True) if a != b
    ]
    assert len(changed) == 2, changed


def test_check_names_each_place_that_drifted(repo_copy: Path) -> None:
    (repo_copy / "VERSION").write_text("9.9.9\n")
    problems = version.check(repo_copy)
    assert len(problems) == 3
    assert all("make version" in p for p in problems)


def test_set_refuses_a_version_that_is_not_semantic(repo_copy: Path) -> None:
    with pytest.raises(ValueError, match="not a semantic version"):
        version.sync(repo_copy, "v1")
