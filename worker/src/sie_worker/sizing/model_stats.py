"""What capacity planning reads from a model directory: shape, dtype, parameter count.

``config.json`` (read by :mod:`sie_worker.config.load.hf_config`) gives layers, attention and KV
heads, head_dim, the dtype and any quantization, and the routed experts of a
mixture-of-experts model; sizing refuses a config.json that lacks
layers, attention heads or head_dim, or holds a field that is not a positive integer.
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

from sie_worker.config.load.hf_config import (
    HFConfig,
    HFConfigError,
    dtype_bits,
    parse_hf_config,
    read_hf_config,
)
from sie_worker.sizing.arithmetic import Shape

__all__ = [
    "Checkpoint",
    "ModelStats",
    "ModelStatsError",
    "Weights",
    "read_checkpoint",
    "read_model_stats",
    "resolve_weights",
    "shape_from_config",
]

_INDEX_NAME = "model.safetensors.index.json"
_MAX_HEADER_BYTES = 100 * 2**20  # real headers are a few MB; refuse a corrupt length


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
    experts: int | None = None  # routed experts (mixture of experts); None: a dense model


def _shape(hf: HFConfig) -> Shape:
    # Refusals in the order a reader meets the fields: layers and heads, then the rest.
    for name in ("layers", "attention_heads"):
        if name in hf.invalid:
            raise ModelStatsError(hf.invalid[name])
    layers, heads = hf.layers, hf.attention_heads
    if layers is None or heads is None:
        named = (("num_hidden_layers", layers), ("num_attention_heads", heads))
        missing = " and ".join(key for key, value in named if value is None)
        raise ModelStatsError(f"{hf.source}: {missing} missing; size needs both")
    for name in ("kv_heads", "head_dim", "kv_latent_dim"):
        if name in hf.invalid:
            raise ModelStatsError(hf.invalid[name])
    if hf.head_dim is None:
        raise ModelStatsError(f"{hf.source}: neither head_dim nor hidden_size is set")
    # Known heads and a valid (or absent) KV count always give a KV count.
    assert hf.kv_heads is not None
    return Shape(
        layers=layers,
        attention_heads=heads,
        kv_heads=hf.kv_heads,
        head_dim=hf.head_dim,
        kv_latent_dim=hf.kv_latent_dim,
    )


def shape_from_config(config: Mapping[str, Any], *, where: str = "config.json") -> Shape:
    """The :class:`Shape` of a parsed config.json; the error names the missing field."""
    return _shape(parse_hf_config(config, source=where))


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
        hf = read_hf_config(config_path)
    except HFConfigError as exc:
        raise ModelStatsError(str(exc)) from exc
    shape = _shape(hf)
    for name in ("max_position_embeddings", "experts"):
        if name in hf.invalid:
            raise ModelStatsError(hf.invalid[name])
    return ModelStats(
        config_path=config_path,
        shape=shape,
        bits_per_weight=hf.bits_per_weight,
        bits_source=hf.bits_source,
        quantized=hf.quantized,
        checkpoint=read_checkpoint(config_path.parent, quantized=hf.quantized),
        max_position_embeddings=hf.max_position_embeddings,
        experts=hf.experts,
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
    runtime = None if stats.quantized else dtype_bits(precision)
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
