"""The tiny GGUF model of the llama.cpp tests: gguf's own reader loads it, its metadata says
what llama.cpp needs (Llama, F32, a ``gpt2`` tokenizer with every byte, ChatML), and every
run writes the same bytes."""

from __future__ import annotations

import time
from pathlib import Path

import gguf
import pytest

from tests.support.tiny_gguf import CHATML_TEMPLATE, TINY_GGUF, TINY_GGUF_FILE, write_tiny_gguf


@pytest.fixture(scope="module")
def reader(tmp_path_factory: pytest.TempPathFactory) -> gguf.GGUFReader:
    path = write_tiny_gguf(tmp_path_factory.mktemp("gguf"))
    return gguf.GGUFReader(path)


def _value(reader: gguf.GGUFReader, key: str) -> object:
    field = reader.get_field(key)
    assert field is not None, f"{key} is missing"
    return field.contents()


def test_the_model_is_a_llama_of_the_stated_shape_in_f32(reader: gguf.GGUFReader) -> None:
    assert _value(reader, "general.architecture") == "llama"
    assert _value(reader, "general.file_type") == gguf.LlamaFileType.ALL_F32
    assert _value(reader, "llama.context_length") == TINY_GGUF.context_length
    assert _value(reader, "llama.embedding_length") == TINY_GGUF.embedding_length
    assert _value(reader, "llama.block_count") == TINY_GGUF.block_count
    assert _value(reader, "llama.attention.head_count") == TINY_GGUF.head_count
    assert _value(reader, "llama.attention.head_count_kv") == TINY_GGUF.head_count_kv
    assert _value(reader, "llama.rope.dimension_count") == TINY_GGUF.head_dim
    assert {t.tensor_type for t in reader.tensors} == {gguf.GGMLQuantizationType.F32}
    names = {t.name for t in reader.tensors}
    assert {"token_embd.weight", "output_norm.weight", "output.weight"} <= names
    assert f"blk.{TINY_GGUF.block_count - 1}.ffn_down.weight" in names


def test_the_tensors_have_llama_cpps_layout(reader: gguf.GGUFReader) -> None:
    shapes = {t.name: tuple(int(n) for n in t.shape) for t in reader.tensors}
    embd, vocab = TINY_GGUF.embedding_length, TINY_GGUF.vocab_size
    kv_width = TINY_GGUF.head_count_kv * TINY_GGUF.head_dim
    # ggml's dimensions, innermost first: {n_in, n_out}
    assert shapes["token_embd.weight"] == (embd, vocab)
    assert shapes["output.weight"] == (embd, vocab)
    assert shapes["blk.0.attn_k.weight"] == (embd, kv_width)
    assert shapes["blk.0.ffn_down.weight"] == (TINY_GGUF.feed_forward_length, embd)


def test_the_tokenizer_is_a_byte_level_bpe_with_chatml(reader: gguf.GGUFReader) -> None:
    assert _value(reader, "tokenizer.ggml.model") == "gpt2"
    tokens = _value(reader, "tokenizer.ggml.tokens")
    assert isinstance(tokens, list)
    assert len(tokens) == TINY_GGUF.vocab_size == _value(reader, "llama.vocab_size")
    # GPT-2's byte alphabet: a space is "Ġ", a newline "Ċ"; with all 256 any text encodes
    assert {"Ġ", "Ċ", "A", "!"} <= set(tokens)
    assert tokens[-3:] == list(TINY_GGUF.special_tokens)
    merges = _value(reader, "tokenizer.ggml.merges")
    assert isinstance(merges, list)
    assert merges
    assert all(len(m.split(" ")) == 2 for m in merges)
    eos, bos = (_value(reader, f"tokenizer.ggml.{t}_token_id") for t in ("eos", "bos"))
    assert isinstance(eos, int)
    assert isinstance(bos, int)
    assert (tokens[eos], tokens[bos]) == ("<|im_end|>", "<|endoftext|>")
    types = _value(reader, "tokenizer.ggml.token_type")
    assert isinstance(types, list)
    assert types[-3:] == [gguf.TokenType.CONTROL] * 3
    assert _value(reader, "tokenizer.chat_template") == CHATML_TEMPLATE


def test_two_runs_write_the_same_bytes_in_well_under_a_second(tmp_path: Path) -> None:
    started = time.monotonic()
    first = write_tiny_gguf(tmp_path / "a")
    elapsed = time.monotonic() - started
    second = write_tiny_gguf(tmp_path / "b")
    assert first.name == TINY_GGUF_FILE
    assert first.read_bytes() == second.read_bytes()
    assert first.stat().st_size < 1_000_000
    assert elapsed < 3
