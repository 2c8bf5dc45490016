"""A missing Prometheus tool skips its tests on a developer machine and fails them in CI."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import prometheus


def test_a_missing_tool_skips_locally_and_fails_with_ci_true(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(prometheus, "ROOT", tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="scripts/setup-tools"):
        prometheus.tool("promtool")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true requires it"):
        prometheus.tool("promtool")


def test_the_pinned_tools_are_found_in_dot_tools(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / ".tools" / "bin").mkdir(parents=True)
    (tmp_path / ".tools" / "bin" / "prometheus").write_text("")
    monkeypatch.setattr(prometheus, "ROOT", tmp_path)

    assert prometheus.tool("prometheus") == str(tmp_path / ".tools" / "bin" / "prometheus")
