"""LoRA adapter memory for ``sie-worker size``. Pure arithmetic over shapes and numbers.

A LoRA adapter adds two matrices to each adapted module: A (rank x in) and B (out x rank),
so a module with ``in`` inputs and ``out`` outputs gains rank x (in + out) parameters. For
the seven projections of a Llama-style layer (``q_proj``, ``k_proj``, ``v_proj``,
``o_proj``, ``gate_proj``, ``up_proj``, ``down_proj``), with hidden size H, intermediate
size I, query width Q (heads x head_dim) and KV width K (KV heads x head_dim):

    per rank per layer = (H + Q) + 2 (H + K) + (Q + H) + 2 (H + I) + (I + H)

Llama 3 8B (H 4096, I 14336, Q 4096, K 1024, 32 layers) gains 81,920 parameters per rank
per layer: a rank-16 adapter is 41,943,040 parameters, 83.9 MB in BF16.

An engine reserves adapter buffers on the GPU for ``max_loras_per_batch`` adapters at the
largest rank (SGLang's LoRA memory pool: ``--max-loras-per-batch`` x ``--max-lora-rank``,
the rank inferred from the adapters when the flag is absent), whatever is loaded: memory
the KV cache does not get (4 slots at rank 64: 1.34 GB on Llama 3 8B). And the reason to
serve adapters at all: N fine-tunes as merged models need N x the base weights; as one
base plus adapters, the base plus N adapters.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sie_worker.config.load.hf_config import HFConfig

__all__ = [
    "ALL_MODULES",
    "LoraSizing",
    "adapter_bytes",
    "buffer_bytes",
    "lora_sizing",
    "module_dims",
    "params_per_rank_per_layer",
    "projection_dims",
]

ALL_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def module_dims(
    hidden: int, intermediate: int, q_dim: int, kv_dim: int
) -> dict[str, tuple[int, int]]:
    """``(in, out)`` of each projection of one layer."""
    return {
        "q_proj": (hidden, q_dim),
        "k_proj": (hidden, kv_dim),
        "v_proj": (hidden, kv_dim),
        "o_proj": (q_dim, hidden),
        "gate_proj": (hidden, intermediate),
        "up_proj": (hidden, intermediate),
        "down_proj": (intermediate, hidden),
    }


def projection_dims(hf: HFConfig) -> dict[str, tuple[int, int]] | None:
    """The projections of a model's config.json (its text model's, for multimodal ones:
    :mod:`sie_worker.config.load.hf_config`), or None when it lacks the hidden size, the
    intermediate size or the head counts."""
    hidden, intermediate = hf.hidden_size, hf.intermediate_size
    heads, kv_heads, head_dim = hf.attention_heads, hf.kv_heads, hf.head_dim
    if hidden is None or intermediate is None or heads is None:
        return None
    if kv_heads is None or head_dim is None:
        return None
    return module_dims(hidden, intermediate, heads * head_dim, kv_heads * head_dim)


def params_per_rank_per_layer(
    dims: Mapping[str, tuple[int, int]], modules: Iterable[str] = ALL_MODULES
) -> int:
    """Adapter parameters per unit of rank in one layer: the sum of in + out over the
    adapted modules (unknown module names count nothing)."""
    return sum(sum(dims[m]) for m in dict.fromkeys(modules) if m in dims)


def adapter_bytes(rank: int, per_rank_per_layer: int, layers: int, bytes_per_value: float) -> float:
    return rank * per_rank_per_layer * layers * bytes_per_value


def buffer_bytes(
    slots: int, max_rank: int, per_rank_per_layer: int, layers: int, bytes_per_value: float
) -> float:
    """The GPU adapter buffers an engine reserves: ``slots`` adapters at ``max_rank``."""
    return slots * adapter_bytes(max_rank, per_rank_per_layer, layers, bytes_per_value)


@dataclass(frozen=True)
class LoraSizing:
    adapters: int  # declared adapters
    rank: int  # the adapters' (largest) rank
    rank_source: str
    max_rank: int  # the engine's buffer rank (--max-lora-rank, else the adapters' rank)
    max_rank_source: str
    modules: tuple[str, ...]
    params_per_rank_per_layer: int
    adapter_params: int  # one adapter at ``rank``
    adapter_bytes: float
    slots: int  # max_loras_per_batch
    buffer_bytes: float  # GPU buffers reserved by the engine
    merged_bytes: float  # the adapters as merged models: adapters x base weights
    shared_bytes: float  # one base plus every adapter


def lora_sizing(
    *,
    adapters: int,
    dims: Mapping[str, tuple[int, int]],
    layers: int,
    base_bytes: float,
    rank: tuple[int, str],
    max_rank: tuple[int, str] | None,
    slots: int,
    modules: Iterable[str] = ALL_MODULES,
    bytes_per_value: float = 2.0,
) -> LoraSizing:
    """The adapter memory of ``adapters`` adapters of ``rank`` (value, where it came from)."""
    mods = tuple(m for m in dict.fromkeys(modules) if m in dims)
    per_rank = params_per_rank_per_layer(dims, mods)
    buffer_rank = max_rank or rank
    one = adapter_bytes(rank[0], per_rank, layers, bytes_per_value)
    return LoraSizing(
        adapters=adapters,
        rank=rank[0],
        rank_source=rank[1],
        max_rank=buffer_rank[0],
        max_rank_source=buffer_rank[1],
        modules=mods,
        params_per_rank_per_layer=per_rank,
        adapter_params=rank[0] * per_rank * layers,
        adapter_bytes=one,
        slots=slots,
        buffer_bytes=buffer_bytes(slots, buffer_rank[0], per_rank, layers, bytes_per_value),
        merged_bytes=adapters * base_bytes,
        shared_bytes=base_bytes + adapters * one,
    )
