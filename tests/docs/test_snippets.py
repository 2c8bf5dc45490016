"""Every snippet of the docs that claims an output is run, checked by a named test, or marked
illustrative (the marks: tests/docs/snippets.py); the `<!-- run -->` ones run here."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.snippets import Snippet, claims_output, doc_files, mark_of, snippets
from tests.support.repo import ROOT

_ALL = [s for path in doc_files(ROOT) for s in snippets(path)]
_RUN = [s for s in _ALL if s.mark == "run"]
_FIX = (
    "put <!-- run --> (a `$ sie-worker ...` console block this test runs), "
    "<!-- tested-by: PATH::TEST --> or <!-- illustrative --> on the line before its fence"
)


def test_every_snippet_that_claims_an_output_is_run_tested_or_marked_illustrative() -> None:
    unmarked = [s.where for s in _ALL if claims_output(s) and mark_of(s)[0] is None]
    assert unmarked == [], f"snippets claim an output but nothing checks it: {unmarked}; {_FIX}"


def test_every_tested_by_mark_names_a_test_that_exists() -> None:
    missing = []
    for snippet in _ALL:
        if snippet.tested_by:
            path, _, name = snippet.tested_by.partition("::")
            source = ROOT / path
            if (
                not name
                or not source.is_file()
                or f"def {name}(" not in source.read_text(encoding="utf-8")
            ):
                missing.append(f"{snippet.where}: {snippet.tested_by}")
    assert missing == []


def test_the_marks_are_spelled_as_the_tests_read_them() -> None:
    # A mark with a typo would silently mark nothing; every "<!-- word" comment before a fence
    # must be one of the marks.
    odd = []
    for path in doc_files(ROOT):
        lines = path.read_text(encoding="utf-8").split("\n")
        for i, line in enumerate(lines[1:], 1):
            if line.lstrip().startswith(("```", "~~~")) and lines[i - 1].startswith("<!--"):
                mark = lines[i - 1]
                if not re.fullmatch(r"<!-- (run|illustrative|tested-by: \S+::\w+) -->", mark):
                    odd.append(f"{path.name}:{i}: {mark}")
    assert odd == []


def _files(snippet: Snippet) -> dict[str, str]:
    """The page's `yaml` blocks that start with `# NAME.yaml`: the inputs of its commands."""
    found = {}
    for block in snippets(snippet.path):
        first = block.body.split("\n", 1)[0]
        if block.lang == "yaml" and re.fullmatch(r"# [\w.-]+\.ya?ml", first):
            found[first[2:]] = block.body + "\n"
    return found


def _runs(body: str) -> list[tuple[str, list[str]]]:
    """``(command line, expected output lines)`` for each `$ ` line of a console block."""
    runs: list[tuple[str, list[str]]] = []
    for line in body.split("\n"):
        if line.startswith("$ "):
            runs.append((line[2:], []))
        elif runs:
            runs[-1][1].append(line)
    return runs


@pytest.mark.parametrize("snippet", _RUN, ids=lambda s: s.where)
def test_run_snippet_prints_what_the_page_shows(snippet: Snippet, tmp_path: Path) -> None:
    for name, text in _files(snippet).items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    for command, shown in _runs(snippet.body):
        words = shlex.split(command)
        assignments = {}
        while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
            key, _, value = words.pop(0).partition("=")
            assignments[key] = value
        assert words[:1] == ["sie-worker"], (
            f"{snippet.where}: only sie-worker commands run: {command}"
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SIE_", "HF_"))}
        env.update(HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path / "hub"), **assignments)
        result = subprocess.run(
            [sys.executable, "-m", "sie_worker", *words[1:]],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        printed = (result.stdout + result.stderr).rstrip("\n").split("\n")
        assert printed == [line for line in shown if line or printed.count("")], (
            f"{snippet.where}: `{command}` printed:\n" + "\n".join(printed)
        )
