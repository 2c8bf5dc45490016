"""Llama 3.1 figures that ``sie-worker size`` must reproduce, shared by the sizing tests of
the arithmetic (worker/tests/sizing) and of the command (worker/tests/commands): the
shapes as config.json holds them, the parameter counts, and the "why split a model" table
(8192-token context, 32 sequences, 80 GB GPUs at 90% usable)."""

from __future__ import annotations

from typing import Any

from sie_worker.config.widths import width_fits_heads
from sie_worker.sizing.arithmetic import (
    Hardware,
    ModelSize,
    Workload,
    fits_width,
    usable_bytes,
    weights_bytes,
)
from sie_worker.sizing.model_stats import shape_from_config

__all__ = [
    "GB",
    "H100",
    "LLAMA",
    "SEED_004_LAYOUTS",
    "SEED_004_LAYOUT_USABLE",
    "SEED_004_TABLE",
    "SEED_004_USERS",
    "in_node_layouts",
    "llama_size",
]

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

# Seed 004, Example 14 ("choosing a layout"): the six setups of ChooseLayout.main as its
# Setup records give them (name, weights GB, GPU GB, GPUs per node, nodes, NVLink, MoE), its
# 60% rule (keep 40% of each GPU for the KV cache and buffers), and the line it prints after
# each name; then that line's figures: GPUs needed, TP, PP, nodes one engine spans, replicas
# (DP), expert parallel (TP/PP/nodes None: "does not fit").
SEED_004_LAYOUT_USABLE = 0.6
SEED_004_LAYOUTS: list[tuple[Any, ...]] = [
    ("8B BF16, 8 x 80 GB NVLink", 16.1, 80, 8, 1, True, False,
     "needs 1 GPU(s) -> no split, 8 replicas (DP)", 1, 1, 1, 1, 8, False),
    ("70B BF16, 8 x 80 GB NVLink", 141.2, 80, 8, 1, True, False,
     "needs 3 GPU(s) -> TP=4, 2 replicas (DP)", 3, 4, 1, 1, 2, False),
    ("32B 4.5-bit, 2 x 24 GB PCIe", 18.5, 24, 2, 1, False, False,
     "needs 2 GPU(s) -> PP=2 (PCIe: communicate once per stage)", 2, 1, 2, 1, 1, False),
    ("405B FP8, 2 nodes x 8 x 80 GB", 405, 80, 8, 2, True, False,
     "needs 9 GPU(s) -> TP=8 inside a node, PP=2 across nodes", 9, 8, 2, 2, 1, False),
    ("MoE 235B FP8, 8 x 80 GB NVLink", 235, 80, 8, 1, True, True,
     "needs 5 GPU(s) -> TP=8, expert parallel for the MoE layers", 5, 8, 1, 1, 1, True),
    ("405B FP8, 8 x 80 GB NVLink", 405, 80, 8, 1, True, False,
     "does not fit: 9 GPUs needed, 8 present", 9, None, None, None, None, False),
]  # fmt: skip


def llama_size(name: str, bits: float) -> ModelSize:
    """Llama 3.1 ``name`` (8B, 70B, 405B) at ``bits`` per weight."""
    params, config = LLAMA[name]
    return ModelSize(shape_from_config(config), weights_bytes(params, bits))


def in_node_layouts(
    model: ModelSize, work: Workload, hw: Hardware, needed: int
) -> list[tuple[int, int]]:
    """Every (TP, PP) inside one node that holds the model, by brute force: TP 1..8 suiting
    the heads, PP 1..8 and at most the layers, at least ``needed`` GPUs and at most the node's
    in all (one contiguous block), the weights and KV cache fitting every GPU."""
    shape, per_gpu = model.shape, usable_bytes(hw.gpu_memory_bytes, hw.usable)
    tokens = work.context_tokens * work.sequences
    return [
        (tp, pp)
        for tp in range(1, 9)
        for pp in range(1, min(8, shape.layers) + 1)
        if width_fits_heads(tp, shape.attention_heads, shape.kv_heads)
        and needed <= tp * pp <= hw.gpus_per_node
        and fits_width(model, tp, tokens, per_gpu, pipeline=pp)
    ]
