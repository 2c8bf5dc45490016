"""The block count ``sie-worker plan`` reads from a GGUF header."""

from __future__ import annotations

from pathlib import Path

from tests.support.tiny_gguf import TINY_GGUF, write_tiny_gguf

from sie_worker.engines.llamacpp.gguf_header import block_count


def test_the_block_count_of_a_written_gguf_is_read_from_its_header(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path)
    assert block_count(path) == TINY_GGUF.block_count


def test_a_file_that_is_no_gguf_has_none(tmp_path: Path) -> None:
    (tmp_path / "x.gguf").write_bytes(b"not a gguf file at all")
    assert block_count(tmp_path / "x.gguf") is None
    assert block_count(tmp_path / "missing.gguf") is None
