"""What ``sie-worker size`` knows of a GGUF model, read from its file's header
(:mod:`.gguf_header`) instead of a config.json and safetensors: its shape (layers, heads, KV
heads, hidden size, feed-forward size, vocabulary, experts), its context length, and its
checkpoint (the file's bytes and the tensors' parameters, whose ratio is its bits per
weight: a GGUF holds its own, usually quantized, types)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sie_worker.engines.llamacpp.argv import gguf_path
from sie_worker.engines.llamacpp.gguf_header import GgufHeader, read_header
from sie_worker.sizing.model_stats import Checkpoint, ModelStats, ModelStatsError, shape_from_config

__all__ = ["gguf_model_stats"]

# GGUF keys (after the architecture's prefix) -> the config.json names the shape reads.
_SHAPE_KEYS = {
    "block_count": "num_hidden_layers",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "attention.key_length": "head_dim",
    "expert_count": "num_local_experts",
}


def gguf_model_stats(folder: Path, loadtime: Mapping[str, Any]) -> ModelStats | None:
    """The stats of the GGUF file a load in ``folder`` would serve; None when there is none.
    Raises :class:`ModelStatsError` naming the file when its header lacks the shape."""
    path = Path(gguf_path(str(folder), loadtime.get("gguf_file")))
    if not path.is_file():
        return None
    header = read_header(path)
    if header is None:
        raise ModelStatsError(f"{path}: not a GGUF file (v2 or v3) whose header reads")
    config = _config(header)
    shape = shape_from_config(config, where=str(path))
    size = path.stat().st_size
    bits = size * 8 / header.params if header.params else None
    context = header.arch_value("context_length")
    experts = config.get("num_local_experts")
    return ModelStats(
        config_path=path,
        shape=shape,
        bits_per_weight=bits,
        bits_source="the GGUF file's bytes over its parameters",
        quantized=True,  # its tensors keep the file's types: no runtime dtype applies
        checkpoint=Checkpoint(header.params or None, size, "GGUF header"),
        max_position_embeddings=context if isinstance(context, int) else None,
        experts=experts if isinstance(experts, int) and experts > 0 else None,
    )


def _config(header: GgufHeader) -> dict[str, Any]:
    config: dict[str, Any] = {}
    for key, name in _SHAPE_KEYS.items():
        value = header.arch_value(key)
        if isinstance(value, int) and not isinstance(value, bool):
            config[name] = value
    vocab = header.arch_value("vocab_size")
    if isinstance(vocab, int):
        config["vocab_size"] = vocab
    return config
