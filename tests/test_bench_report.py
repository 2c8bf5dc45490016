"""Benchmarks write their own section of docs/benchmarks.md and must keep everyone else's."""

from __future__ import annotations

from pathlib import Path

from tests.bench.report import record_section

DOC = "# Benchmarks\n\nintro\n\n## A\na body\n\n### a detail\nmore\n\n## B\nb body\n"


def test_a_section_is_replaced_in_place_and_the_others_are_kept(tmp_path: Path) -> None:
    path = tmp_path / "benchmarks.md"
    path.write_text(DOC)
    record_section(path, "## A\nnew body\n")
    assert path.read_text() == "# Benchmarks\n\nintro\n\n## A\nnew body\n\n## B\nb body\n"


def test_a_new_section_goes_at_the_end_and_a_missing_file_is_started(tmp_path: Path) -> None:
    path = tmp_path / "benchmarks.md"
    path.write_text(DOC)
    record_section(path, "## C\nc body")
    assert path.read_text() == DOC + "\n## C\nc body\n"
    fresh = tmp_path / "fresh.md"
    record_section(fresh, "## C\nc body\n")
    assert fresh.read_text() == "# Benchmarks\n\n## C\nc body\n"


def test_recording_the_same_section_twice_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "benchmarks.md"
    path.write_text(DOC)
    record_section(path, "## B\nb body\n")
    once = path.read_text()
    record_section(path, "## B\nb body\n")
    assert path.read_text() == once == DOC
