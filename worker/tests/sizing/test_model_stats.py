from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from sie_worker.sizing.model_stats import (
    ModelStatsError,
    read_checkpoint,
    read_model_stats,
    resolve_weights,
    shape_from_config,
)

LLAMA_8B = {
    "architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 4096,
    "torch_dtype": "bfloat16",
    "max_position_embeddings": 131072,
}


def _write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int], int]]) -> None:
    """A real safetensors file: header with dtype/shape/offsets, then zero bytes of data."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape, nbytes) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)


def _model_dir(tmp_path: Path, config: dict[str, Any]) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_shape_reads_text_config_of_a_multimodal_model() -> None:
    config = {"architectures": ["Llava"], "text_config": dict(LLAMA_8B), "vision_config": {}}
    shape = shape_from_config(config)
    assert (shape.layers, shape.attention_heads, shape.kv_heads, shape.head_dim) == (32, 32, 8, 128)


def test_explicit_head_dim_wins_over_hidden_size() -> None:
    shape = shape_from_config({**LLAMA_8B, "head_dim": 256})
    assert shape.head_dim == 256


def test_kv_heads_default_to_attention_heads_and_multi_query_to_one() -> None:
    config = {k: v for k, v in LLAMA_8B.items() if k != "num_key_value_heads"}
    assert shape_from_config(config).kv_heads == 32
    assert shape_from_config({**config, "multi_query": True}).kv_heads == 1


def test_missing_layers_names_the_field() -> None:
    config = {k: v for k, v in LLAMA_8B.items() if k != "num_hidden_layers"}
    with pytest.raises(ModelStatsError, match="num_hidden_layers missing"):
        shape_from_config(config)


def test_non_integer_head_count_names_the_field() -> None:
    with pytest.raises(ModelStatsError, match="num_key_value_heads is '8'"):
        shape_from_config({**LLAMA_8B, "num_key_value_heads": "8"})


def test_checkpoint_totals_come_from_safetensors_headers(tmp_path: Path) -> None:
    _write_safetensors(
        tmp_path / "model.safetensors",
        {"a": ("BF16", [4, 8], 64), "b": ("F32", [3], 12), "c": ("BF16", [2, 2, 2], 16)},
    )
    checkpoint = read_checkpoint(tmp_path, quantized=False)
    assert (checkpoint.params, checkpoint.bytes) == (4 * 8 + 3 + 8, 64 + 12 + 16)
    assert checkpoint.source == "safetensors headers"


def test_sharded_checkpoint_sums_every_shard_of_the_index(tmp_path: Path) -> None:
    _write_safetensors(tmp_path / "model-00001-of-00002.safetensors", {"a": ("BF16", [10], 20)})
    _write_safetensors(tmp_path / "model-00002-of-00002.safetensors", {"b": ("BF16", [5], 10)})
    index = {
        "metadata": {"total_size": 999},
        "weight_map": {
            "a": "model-00001-of-00002.safetensors",
            "b": "model-00002-of-00002.safetensors",
        },
    }
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    checkpoint = read_checkpoint(tmp_path, quantized=False)
    assert (checkpoint.params, checkpoint.bytes) == (15, 30)


def test_index_metadata_is_used_when_shards_are_not_downloaded(tmp_path: Path) -> None:
    index = {
        "metadata": {"total_size": 16_060_000_000},
        "weight_map": {"a": "model-00001-of-00004.safetensors"},
    }
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    # The HF cache links shards to blobs; a shard not yet fetched is a dangling link.
    (tmp_path / "model-00001-of-00004.safetensors").symlink_to(tmp_path / "missing-blob")
    checkpoint = read_checkpoint(tmp_path, quantized=False)
    assert (checkpoint.params, checkpoint.bytes) == (None, 16_060_000_000)
    assert checkpoint.source == "safetensors index"


def test_corrupt_header_length_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 2**40) + b"{}")
    with pytest.raises(ModelStatsError, match="header length"):
        read_checkpoint(tmp_path, quantized=False)


def test_weights_are_checkpoint_bytes_and_params_follow_from_dtype(tmp_path: Path) -> None:
    model = _model_dir(tmp_path, LLAMA_8B)
    index = {"metadata": {"total_size": 16_060_000_000}, "weight_map": {}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    weights = resolve_weights(read_model_stats(model / "config.json"))
    assert weights.bytes == 16_060_000_000
    assert weights.params == pytest.approx(8.03e9)


def test_bits_flag_rescales_the_counted_parameters(tmp_path: Path) -> None:
    model = _model_dir(tmp_path, LLAMA_8B)
    index = {"metadata": {"total_size": 16_060_000_000}, "weight_map": {}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    weights = resolve_weights(read_model_stats(model / "config.json"), bits=4.5)
    assert weights.bytes == pytest.approx(8.03e9 * 4.5 / 8)
    assert weights.bits_source == "--bits"


def test_params_flag_is_needed_without_safetensors(tmp_path: Path) -> None:
    stats = read_model_stats(_model_dir(tmp_path, LLAMA_8B) / "config.json")
    with pytest.raises(ModelStatsError, match="pass --params"):
        resolve_weights(stats)
    assert resolve_weights(stats, params=8e9).bytes == 16e9


def test_quantized_checkpoint_needs_params_to_change_bits(tmp_path: Path) -> None:
    config = {**LLAMA_8B, "quantization_config": {"quant_method": "fp8"}}
    model = _model_dir(tmp_path, config)
    _write_safetensors(model / "model.safetensors", {"w": ("F8_E4M3", [100], 100)})
    stats = read_model_stats(model / "config.json")
    assert resolve_weights(stats).bytes == 100
    with pytest.raises(ModelStatsError, match="quantized"):
        resolve_weights(stats, bits=4)


def test_unreadable_config_json_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelStatsError, match=r"config\.json: cannot read"):
        read_model_stats(tmp_path / "config.json")


def test_unquantized_weights_are_held_in_the_compute_precision(tmp_path: Path) -> None:
    # A float32 checkpoint served with compute_precision bfloat16 holds half its bytes.
    model = _model_dir(tmp_path, {**LLAMA_8B, "torch_dtype": "float32"})
    _write_safetensors(model / "model.safetensors", {"w": ("F32", [1000], 4000)})
    stats = read_model_stats(model / "config.json")
    assert resolve_weights(stats).bytes == 4000
    served = resolve_weights(stats, compute_precision="bfloat16")
    assert served.bytes == 2000
    assert served.bits_source == "compute_precision bfloat16"
    assert resolve_weights(stats, compute_precision="float32").bytes == 4000
