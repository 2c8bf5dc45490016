"""Hand-written pages that name what the code owns name only what exists, and all of it."""

from __future__ import annotations

import inspect
import re

from sie_worker import errors

from tests.support.repo import ROOT, load_script

DOCS = ROOT / "docs"


def _codes() -> set[str]:
    return {
        c.code
        for c in vars(errors).values()
        if inspect.isclass(c) and issubclass(c, errors.SieError) and c is not errors.SieError
    }


def test_the_workers_error_table_says_when_each_code_is_answered() -> None:
    page = (DOCS / "worker.md").read_text(encoding="utf-8")
    table = page.split("\n| code | when |\n", 1)[1].split("\n\n", 1)[0]
    named = set(re.findall(r"^\| `(\w+)`(?: · `(\w+)`)?", table, re.M))
    listed = {code for pair in named for code in pair if code}
    gateway = (DOCS / "gateway.md").read_text(encoding="utf-8")
    elsewhere = {code for code in _codes() if re.search(rf"\b{code}\b", gateway)}
    assert listed <= _codes(), f"not error codes of sie_worker/errors.py: {listed - _codes()}"
    assert _codes() - listed - elsewhere == set(), "codes no page says when they happen"


def test_every_page_is_in_the_nav() -> None:
    import yaml

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))

    def pages(nav: object) -> list[str]:
        if isinstance(nav, str):
            return [nav]
        if isinstance(nav, dict):
            return [p for v in nav.values() for p in pages(v)]
        if isinstance(nav, list):
            return [p for v in nav for p in pages(v)]
        return []

    in_nav = set(pages(config["nav"]))
    on_disk = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert on_disk - in_nav == set(), "pages missing from the nav of mkdocs.yml"


def test_each_process_page_explains_every_variable_its_settings_read() -> None:
    read = load_script("docs_reference")._read_by_settings()
    pages = {"worker": "worker.md", "slot router": "router.md", "gateway": "gateway.md"}
    missing = []
    for process, page in pages.items():
        text = (DOCS / page).read_text(encoding="utf-8")
        missing += [
            f"{page}: {name}"
            for name, readers in sorted(read.items())
            if process in readers and f"`{name}`" not in text
        ]
    assert missing == [], "variables read but not explained (generated list: environment.md)"
