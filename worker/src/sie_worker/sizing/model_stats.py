"""What capacity planning reads from a model directory: shape, dtype, parameter count.

``config.json`` gives layers, attention and KV heads, head_dim (else hidden_size / heads),
the dtype and any quantization; multimodal models keep these in ``text_config``.
Parameter count and checkpoint bytes come from the safetensors files: each file's header
(8-byte length, then JSON with every tensor's dtype, shape and byte range), read without
touching the tensor data, else the index's ``metadata`` (``total_size`` in bytes,
``total_parameters`` when present) when the shards themselves are not on disk.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sie_worker.sizing.plan import Shape

__all__ = [
    "Checkpoint",
    "ModelStats",
    "ModelStatsError",
    "Weights",
    "bits_from_config",
    "read_checkpoint",
    "read_model_stats",
    "resolve_weights",
    "shape_from_config",
]

_INDEX_NAME = "model.safetensors.index.json"
_MAX_HEADER_BYTES = 100 * 2**20  # real headers are a few MB; refuse a corrupt length
_FLOAT_BITS = {
    "float32": 32,
    "float": 32,
    "fp32": 32,
    "bfloat16": 16,
    "bf16": 16,
    "float16": 16,
    "half": 16,
    "fp16": 16,
    "float8_e4m3fn": 8,
    "float8_e5m2": 8,
    "fp8": 8,
}
# Per-group scale (16 bits) and zero point (the weight's own bits) of GPTQ/AWQ-style groups.
_GROUP_OVERHEAD_BITS = 16


class ModelStatsError(ValueError):
    """config.json or a safetensors file cannot be read; the message names file and field."""


@dataclass(frozen=True)
class Checkpoint:
    """Totals over the safetensors files: ``params`` None where they cannot be counted."""

    params: int | None
    bytes: int | None
    source: str  # "safetensors headers" | "safetensors index" | "none"


@dataclass(frozen=True)
class ModelStats:
    config_path: Path
    shape: Shape
    bits_per_weight: float | None  # from dtype / quantization_config; None when unknown
    bits_source: str
    quantized: bool
    checkpoint: Checkpoint
    max_position_embeddings: int | None


def _text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    # Multimodal configs keep the language model's shape in text_config (seed 000).
    for key in ("text_config", "llm_config", "language_config"):
        inner = config.get(key)
        if isinstance(inner, Mapping) and "num_attention_heads" in inner:
            return inner
    return config


def _positive_int(config: Mapping[str, Any], names: tuple[str, ...], where: str) -> int | None:
    for name in names:
        value = config.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ModelStatsError(f"{where}: {name} is {value!r}, expected a positive integer")
        return value
    return None


def shape_from_config(config: Mapping[str, Any], *, where: str = "config.json") -> Shape:
    """The :class:`Shape` of a parsed config.json; the error names the missing field."""
    text = _text_config(config)
    layers = _positive_int(text, ("num_hidden_layers", "n_layer", "num_layers"), where)
    heads = _positive_int(text, ("num_attention_heads", "n_head"), where)
    missing = [
        n for n, v in (("num_hidden_layers", layers), ("num_attention_heads", heads)) if v is None
    ]
    if missing or layers is None or heads is None:
        raise ModelStatsError(f"{where}: {' and '.join(missing)} missing; size needs both")
    kv = _positive_int(text, ("num_key_value_heads", "n_head_kv", "num_kv_heads"), where)
    if kv is None:
        kv = 1 if text.get("multi_query") is True else heads
    head_dim = _positive_int(text, ("head_dim",), where)
    if head_dim is None:
        hidden = _positive_int(text, ("hidden_size", "n_embd", "d_model"), where)
        if hidden is None:
            raise ModelStatsError(f"{where}: neither head_dim nor hidden_size is set")
        head_dim = hidden // heads
    latent = None
    kv_lora_rank = _positive_int(text, ("kv_lora_rank",), where)
    if kv_lora_rank is not None:
        latent = kv_lora_rank + (_positive_int(text, ("qk_rope_head_dim",), where) or 0)
    return Shape(
        layers=layers, attention_heads=heads, kv_heads=kv, head_dim=head_dim, kv_latent_dim=latent
    )


def bits_from_config(config: Mapping[str, Any]) -> tuple[float | None, str, bool]:
    """(bits per weight, where they came from, quantized?) from dtype / quantization_config."""
    text = _text_config(config)
    quant = config.get("quantization_config") or text.get("quantization_config")
    if isinstance(quant, Mapping):
        method = str(quant.get("quant_method", "")).lower()
        bits = quant.get("bits", quant.get("w_bit"))
        if isinstance(bits, int | float) and not isinstance(bits, bool) and bits > 0:
            group = quant.get("group_size", quant.get("q_group_size"))
            extra = (
                (_GROUP_OVERHEAD_BITS + bits) / group
                if isinstance(group, int) and not isinstance(group, bool) and group > 0
                else 0.0
            )
            return float(bits) + extra, f"quantization_config ({method or 'bits'})", True
        if method in ("fp8", "fbgemm_fp8"):
            return 8.0, f"quantization_config ({method})", True
        if quant.get("load_in_8bit") is True:
            return 8.0, "quantization_config (load_in_8bit)", True
        if quant.get("load_in_4bit") is True:
            return 4.5, "quantization_config (load_in_4bit)", True
        return None, f"quantization_config ({method or 'unknown'})", True
    for holder in (text, config):
        for key in ("torch_dtype", "dtype"):
            name = holder.get(key)
            if isinstance(name, str) and name.lower() in _FLOAT_BITS:
                return float(_FLOAT_BITS[name.lower()]), f"config.json {key}", False
    return None, "unknown", False


def _read_header(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise ModelStatsError(f"{path}: too short for a safetensors header")
            (length,) = struct.unpack("<Q", raw)
            if length > _MAX_HEADER_BYTES:
                raise ModelStatsError(f"{path}: header length {length} is not plausible")
            header = json.loads(f.read(length))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelStatsError(f"{path}: cannot read safetensors header: {exc}") from exc
    if not isinstance(header, dict):
        raise ModelStatsError(f"{path}: safetensors header is not a JSON object")
    return header


def _header_totals(paths: list[Path]) -> tuple[int, int]:
    params = size = 0
    for path in paths:
        for name, tensor in _read_header(path).items():
            if name == "__metadata__":
                continue
            try:
                start, end = tensor["data_offsets"]
                params += math.prod(int(d) for d in tensor["shape"])
                size += int(end) - int(start)
            except (KeyError, TypeError, ValueError) as exc:
                raise ModelStatsError(f"{path}: tensor {name!r} has no shape/data_offsets") from exc
    return params, size


def read_checkpoint(model_dir: Path, *, quantized: bool) -> Checkpoint:
    """Parameter count and bytes of the safetensors checkpoint in ``model_dir``.

    Packed quantized tensors hold several weights per element, so for a quantized
    checkpoint only bytes are counted, not parameters.
    """
    index_path = model_dir / _INDEX_NAME
    if index_path.is_file():
        try:
            index = json.loads(index_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ModelStatsError(f"{index_path}: cannot read: {exc}") from exc
        weight_map = index.get("weight_map") if isinstance(index, Mapping) else None
        shards = (
            sorted({str(f) for f in weight_map.values()}) if isinstance(weight_map, Mapping) else []
        )
        paths = [model_dir / s for s in shards]
        # A dangling HF-cache symlink (shard not downloaded) is not is_file().
        if paths and all(p.is_file() for p in paths):
            params, size = _header_totals(paths)
            return Checkpoint(None if quantized else params, size, "safetensors headers")
        meta = index.get("metadata") if isinstance(index, Mapping) else None
        meta = meta if isinstance(meta, Mapping) else {}
        total_size = meta.get("total_size")
        total_params = meta.get("total_parameters")
        return Checkpoint(
            int(total_params) if isinstance(total_params, int | float) and not quantized else None,
            int(total_size) if isinstance(total_size, int | float) else None,
            "safetensors index",
        )
    files = sorted(p for p in model_dir.glob("*.safetensors") if p.is_file())
    if files:
        params, size = _header_totals(files)
        return Checkpoint(None if quantized else params, size, "safetensors headers")
    return Checkpoint(None, None, "none")


def read_model_stats(config_path: Path) -> ModelStats:
    """Shape, dtype and checkpoint totals of the model whose config.json is ``config_path``."""
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelStatsError(f"{config_path}: cannot read: {exc}") from exc
    if not isinstance(config, Mapping):
        raise ModelStatsError(f"{config_path}: not a JSON object")
    shape = shape_from_config(config, where=str(config_path))
    bits, bits_source, quantized = bits_from_config(config)
    positions = _positive_int(_text_config(config), ("max_position_embeddings",), str(config_path))
    return ModelStats(
        config_path=config_path,
        shape=shape,
        bits_per_weight=bits,
        bits_source=bits_source,
        quantized=quantized,
        checkpoint=read_checkpoint(config_path.parent, quantized=quantized),
        max_position_embeddings=positions,
    )


@dataclass(frozen=True)
class Weights:
    """The weights figure ``size`` uses, with where each input came from."""

    bytes: float
    source: str
    params: float | None
    params_source: str | None
    bits_per_weight: float | None
    bits_source: str


def resolve_weights(
    stats: ModelStats,
    *,
    params: float | None = None,
    bits: float | None = None,
    compute_precision: str | None = None,
) -> Weights:
    """Weights bytes as the engine holds them.

    With ``--params``/``--bits``: parameters x bits / 8. Unquantized weights are held in the
    profile's ``compute_precision`` (the engine's ``--dtype``), so when that differs from
    the checkpoint's dtype: parameters x its bits / 8. Otherwise the checkpoint's bytes.
    Raises :class:`ModelStatsError` saying which flag supplies what is missing.
    """
    ckpt = stats.checkpoint
    precision = (compute_precision or "").lower()
    runtime = None if stats.quantized else _FLOAT_BITS.get(precision)
    use_bits: float | None
    if bits is not None:
        use_bits, bits_source = bits, "--bits"
    elif runtime is not None:
        use_bits, bits_source = float(runtime), f"compute_precision {precision}"
    else:
        use_bits, bits_source = stats.bits_per_weight, stats.bits_source
    count: float | None = params
    count_source: str | None = "--params" if params is not None else None
    if count is None and ckpt.params is not None:
        count, count_source = ckpt.params, ckpt.source
    elif count is None and ckpt.bytes and stats.bits_per_weight and not stats.quantized:
        count = ckpt.bytes * 8 / stats.bits_per_weight
        count_source = f"{ckpt.source} bytes / {stats.bits_source}"
    as_stored = runtime is None or runtime == stats.bits_per_weight
    if params is None and bits is None and ckpt.bytes and as_stored:
        return Weights(float(ckpt.bytes), ckpt.source, count, count_source, use_bits, bits_source)
    if count is None:
        why = (
            "its checkpoint is quantized, so tensor sizes do not count parameters"
            if stats.quantized and ckpt.bytes
            else "no safetensors files or index next to it"
        )
        raise ModelStatsError(
            f"{stats.config_path}: cannot count the parameters ({why}); "
            "pass --params, e.g. --params 70.6B"
        )
    if use_bits is None:
        raise ModelStatsError(
            f"{stats.config_path}: no dtype or quantization bits in config.json "
            f"({stats.bits_source}); pass --bits, e.g. --bits 16"
        )
    return Weights(
        count * use_bits / 8, "parameters x bits / 8", count, count_source, use_bits, bits_source
    )
