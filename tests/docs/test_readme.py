"""The README stays short, opens with the two commands, and every link in it lands: from it a
new user reaches how to serve a 2-GPU model, why a load was refused, and which values a pool
takes, each in two clicks at most (README -> page -> section)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.repo import ROOT

README = ROOT / "README.md"
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """The anchor mkdocs' toc (and GitHub) give a heading: lower case, words joined by '-'."""
    text = re.sub(r"[`*]", "", heading).strip().lower()
    text = re.sub(r"[^\w\s-]", "", text)
    return re.sub(r"[\s]+", "-", text)


def _anchors(page: Path) -> set[str]:
    text, fenced, found = page.read_text(encoding="utf-8"), False, set()
    for line in text.split("\n"):
        if line.startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced and (match := re.match(r"^#{1,6} (.+)$", line)):
            found.add(_slug(match[1]))
    return found


def _links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return [t for t in _LINK.findall(text) if not re.match(r"^[a-z]+:", t)]


def test_the_readme_is_at_most_300_lines_with_the_two_commands_in_its_first_30() -> None:
    lines = README.read_text(encoding="utf-8").split("\n")
    assert len(lines) <= 300
    assert "make run " in "\n".join(lines[:30])
    assert "make test " in "\n".join(lines[:30])


def test_every_relative_link_of_the_readme_lands() -> None:
    broken = []
    for target in _links(README):
        path, _, anchor = target.partition("#")
        file = (ROOT / path).resolve() if path else README
        missing_anchor = bool(anchor) and file.suffix == ".md" and anchor not in _anchors(file)
        if not file.exists() or missing_anchor:
            broken.append(target)
    assert broken == []


def test_a_new_user_reaches_the_three_answers_in_two_clicks() -> None:
    links = _links(README)
    wanted = {
        "docs/device-groups.md#serve-a-2-gpu-model": "how to serve a 2-GPU model",
        "docs/refusals.md": "why a load was refused",
        "docs/reference/chart-values.md#a-pool": "which values a pool takes",
    }
    for target, question in wanted.items():
        assert target in links, f"the README links no page that says {question}"
    # The refusals page has a section per refusal, with its real message.
    refusals = _anchors(ROOT / "docs" / "refusals.md")
    assert {"when-a-config-is-read", "when-a-model-loads"} <= refusals
    assert "a-width-larger-than-the-workers-device-count-load-time" in refusals
