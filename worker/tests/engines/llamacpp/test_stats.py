"""What ``sie-worker size`` reads of a GGUF model: its header's shape and checkpoint."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest
from tests.support.tiny_gguf import TINY_GGUF, write_tiny_gguf

from sie_worker.cli import main
from sie_worker.engines.llamacpp.gguf_header import read_header
from sie_worker.engines.llamacpp.stats import gguf_model_stats


def test_the_header_gives_the_shape_and_every_tensors_parameters(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path)
    header = read_header(path)
    assert header is not None
    expected = sum(int(t.n_elements) for t in gguf.GGUFReader(path).tensors)
    assert header.params == expected
    stats = gguf_model_stats(tmp_path, {})
    assert stats is not None
    assert stats.shape.layers == TINY_GGUF.block_count
    assert stats.checkpoint.bytes == path.stat().st_size
    assert stats.checkpoint.params == expected
    assert stats.bits_per_weight == pytest.approx(path.stat().st_size * 8 / expected)


def test_size_reads_a_llamacpp_model_from_its_gguf(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_tiny_gguf(tmp_path / "model")
    config = tmp_path / "m.yaml"
    config.write_text(
        "sie_id: org/gguf\n"
        f"model_path: {tmp_path / 'model'}\n"
        "tasks: {generate: {context_length: 256}}\n"
        "profiles:\n  default:\n"
        "    adapter_path: sie_server.adapters.llamacpp.generation:LlamaCppGenerationAdapter\n",
        encoding="utf-8",
    )
    assert main(["size", str(config), "--gpu-type", "L4"]) == 0
    out = capsys.readouterr().out
    assert f"shape         {TINY_GGUF.block_count} layers" in out
    assert "GGUF header" in out
