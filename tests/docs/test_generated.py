"""The generated pages and pictures of the docs site are what their generators write today.

docs/reference/*.md, docs/operations.md (scripts/docs_reference.py, with scripts/docs_api.py)
and docs/img/*.svg (scripts/docs_pictures.py) come from the code, the chart and the
placement code; these tests regenerate them in memory and fail, naming the command that
fixes it, when a committed file differs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.repo import ROOT, load_script

_REFERENCE = load_script("docs_reference")
_PICTURES = load_script("docs_pictures")
_PAGES: dict[Path, str] = _REFERENCE.pages()
_DRAWINGS: dict[Path, str] = _PICTURES.pictures()


def _name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@pytest.mark.parametrize("path", sorted(_PAGES), ids=_name)
def test_generated_page_is_current(path: Path) -> None:
    assert path.is_file(), f"{_name(path)} is missing: run {_REFERENCE.COMMAND}"
    assert path.read_text(encoding="utf-8") == _PAGES[path], (
        f"{_name(path)} is stale: run {_REFERENCE.COMMAND}"
    )


@pytest.mark.parametrize("path", sorted(_DRAWINGS), ids=_name)
def test_picture_is_current(path: Path) -> None:
    assert path.is_file(), f"{_name(path)} is missing: run {_PICTURES.COMMAND}"
    assert path.read_text(encoding="utf-8") == _DRAWINGS[path], (
        f"{_name(path)} is stale: run {_PICTURES.COMMAND}"
    )


def test_every_generated_page_says_how_to_regenerate_it() -> None:
    for path, text in _PAGES.items():
        if path.suffix == ".md":
            assert text.startswith(_REFERENCE.HEADER), _name(path)


def test_a_stale_page_fails_the_check_with_the_command_that_fixes_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    page = next(iter(_PAGES))
    stale = {tmp_path / page.name: "stale\n"}
    (tmp_path / page.name).write_text("old\n", encoding="utf-8")
    monkeypatch.setattr(_REFERENCE, "pages", lambda: stale)
    monkeypatch.setattr(_REFERENCE, "ROOT", tmp_path)
    assert _REFERENCE.main(["--check"]) == 1
    assert f"run {_REFERENCE.COMMAND}" in capsys.readouterr().err


def test_the_placement_picture_shows_what_place_chooses() -> None:
    # The "after" row is place()'s answer, not a drawing: the evicted model is gone from it.
    chosen = _PICTURES.place([_PICTURES._BUDGET] * 4, _PICTURES._BEFORE, 1, need=_PICTURES._NEW[1])
    svg = _DRAWINGS[_PICTURES.IMG / "placement.svg"]
    after = svg.split("after: ", 1)[1]
    assert chosen.evict, "the scene is meant to show an eviction"
    for model in chosen.evict:
        assert f"evicts {model}" in after
        assert f">{model} (" not in after


def test_every_alert_the_chart_defines_has_its_runbook_anchor_on_the_operations_page() -> None:
    import re

    alerts = re.findall(
        r'"alert" "(\w+)"',
        (ROOT / "chart" / "templates" / "_helpers-alerts.tpl").read_text(encoding="utf-8"),
    )
    page = _PAGES[ROOT / "docs" / "operations.md"]
    assert alerts
    # mkdocs' toc slug of "### SieWorkerNotReady" is the alert's name in lower case, the
    # anchor runbookBaseUrl + "#" + lower(alert) points at.
    assert [a for a in alerts if f"\n### {a}\n" not in page] == []


def test_the_load_time_options_page_has_a_row_for_every_sglang_option() -> None:
    from sie_worker.engines.sglang.flags import SGLANG_OPTIONS

    page = _PAGES[ROOT / "docs" / "reference" / "load-time-options.md"]
    rows = {name: _REFERENCE.sglang_option_row(o) for name, o in SGLANG_OPTIONS.items()}
    assert [name for name, row in rows.items() if row not in page] == []
