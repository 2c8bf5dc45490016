"""Llama 3.1 figures that ``sie-worker size`` must reproduce, shared by the sizing tests of
the arithmetic (worker/tests/sizing) and of the command (worker/tests/commands): the
shapes as config.json holds them, the parameter counts, and the "why split a model" table
(8192-token context, 32 sequences, 80 GB GPUs at 90% usable)."""

from __future__ import annotations

from typing import Any

from sie_worker.sizing.arithmetic import Hardware, ModelSize, Workload, weights_bytes
from sie_worker.sizing.model_stats import shape_from_config

__all__ = ["GB", "H100", "LLAMA", "SEED_004_TABLE", "SEED_004_USERS", "llama_size"]

GB = 1e9
# Seed 004's hardware and workload: 80 GB GPUs at 90% usable, 8 per node; 32 sequences of
# 8,192 tokens.
H100 = Hardware(gpu_memory_bytes=80e9, usable=0.9, gpus_per_node=8)
SEED_004_USERS = Workload(context_tokens=8192, sequences=32)

# name -> (parameters, config.json fields)
LLAMA: dict[str, tuple[float, dict[str, Any]]] = {
    "8B": (8.03e9, {"num_hidden_layers": 32, "num_attention_heads": 32,
                    "num_key_value_heads": 8, "hidden_size": 4096}),
    "70B": (70.6e9, {"num_hidden_layers": 80, "num_attention_heads": 64,
                     "num_key_value_heads": 8, "hidden_size": 8192}),
    "405B": (405e9, {"num_hidden_layers": 126, "num_attention_heads": 128,
                     "num_key_value_heads": 8, "hidden_size": 16384}),
}  # fmt: skip

# model, bits, weights GB, KV GB, total GB, GPUs.
SEED_004_TABLE = [
    ("8B", 16, 16.1, 34.4, 50.4, 1),
    ("8B", 8, 8.0, 34.4, 42.4, 1),
    ("8B", 4.5, 4.5, 34.4, 38.9, 1),
    ("70B", 16, 141.2, 85.9, 227.1, 4),
    ("70B", 8, 70.6, 85.9, 156.5, 3),
    ("70B", 4.5, 39.7, 85.9, 125.6, 2),
    ("405B", 16, 810.0, 135.3, 945.3, 14),
    ("405B", 8, 405.0, 135.3, 540.3, 8),
    ("405B", 4.5, 227.8, 135.3, 363.1, 6),
]


def llama_size(name: str, bits: float) -> ModelSize:
    """Llama 3.1 ``name`` (8B, 70B, 405B) at ``bits`` per weight."""
    params, config = LLAMA[name]
    return ModelSize(shape_from_config(config), weights_bytes(params, bits))
