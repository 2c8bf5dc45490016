"""scripts/docs_hooks.py: links from the docs to repository files outside docs/."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.support.repo import ROOT, load_script

_HOOKS = load_script("docs_hooks")
_REPO = "https://github.com/sie-workers/sie-workers"


def _render(markdown: str, page: str = "device-groups.md") -> str:
    config = {"docs_dir": str(ROOT / "docs"), "repo_url": _REPO}
    page_object = SimpleNamespace(file=SimpleNamespace(src_path=page))
    result: str = _HOOKS.on_page_markdown(markdown, page_object, config, None)
    return result


def test_a_link_to_a_repository_file_becomes_its_github_address() -> None:
    assert _render("[chart](../chart/README.md#values)") == (
        f"[chart]({_REPO}/blob/main/chart/README.md#values)"
    )
    assert _render("[models](../values-examples/models/)") == (
        f"[models]({_REPO}/tree/main/values-examples/models)"
    )


def test_links_between_pages_code_and_addresses_stay_as_they_are() -> None:
    text = "[p](placement.md#eviction) `[x](../nope.md)` [w](https://example.com/a)"
    assert _render(text) == text
    fenced = "```md\n[x](../nope.md)\n```"
    assert _render(fenced) == fenced


def test_a_link_to_a_missing_repository_file_is_a_warning_that_strict_counts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="mkdocs.plugins"):
        assert _render("see [this](../nope.yaml)") == "see [this](../nope.yaml)"
    assert [r.name for r in caplog.records] == ["mkdocs.plugins.sie_docs_hooks"]
    assert "device-groups.md: link to ../nope.yaml" in caplog.text


def test_the_site_uses_the_hook_and_make_test_builds_it_strictly() -> None:
    import yaml

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert config["hooks"] == ["scripts/docs_hooks.py"]
    assert Path(ROOT / config["hooks"][0]).is_file()
    steps = (ROOT / "scripts" / "test").read_text(encoding="utf-8")
    assert 'step "docs" docs_build' in steps
    assert re.search(r"mkdocs build --strict --site-dir", steps)
