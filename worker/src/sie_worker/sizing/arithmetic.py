"""Capacity arithmetic for ``sie-worker size``: the model's shape and numbers, and the sums
everything else is built from. Pure functions, no I/O.

Units: bytes throughout, "GB" in messages is 1e9 bytes (the GPU data sheets' unit, see
:mod:`sie_worker.sizing.gpus`).

- weights = parameters x bits per weight / 8;
- KV cache per token = 2 (K and V) x layers x KV heads x head_dim x bytes per value
  (a latent-attention model stores one latent vector per layer instead);
- minimum GPUs = ceil(need / (GPU memory x usable fraction));
- weights per GPU are weights / width: tensor parallelism splits every large matrix, and
  the pieces it copies to every rank (norms, biases) are small. KV heads are split while
  there are at least as many as the width and copied when there are fewer, so a width above
  the KV head count stores more KV per token. Every layer is counted as full attention, so
  sliding-window models get an upper bound;
- pipeline stages split the layers: each of ``pipeline`` stages holds 1/pipeline of the
  weights and of the KV cache (beside the tensor split inside the stage).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "EPS",
    "GB",
    "GIB",
    "Hardware",
    "ModelSize",
    "Shape",
    "Workload",
    "fits_width",
    "is_power_of_two",
    "kv_bytes_per_token",
    "kv_bytes_per_token_per_gpu",
    "max_concurrency",
    "minimum_gpus",
    "usable_bytes",
    "weights_bytes",
]

GB = 1e9
GIB = 2**30
EPS = 1e-9  # ceil() of a ratio that is an integer up to float rounding stays that integer


@dataclass(frozen=True)
class Shape:
    """What the arithmetic needs from a model's ``config.json``."""

    layers: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    # Multi-head latent attention (DeepSeek): one vector of this size per token and layer,
    # kept whole on every rank. None for ordinary (grouped-query) attention.
    kv_latent_dim: int | None = None


@dataclass(frozen=True)
class ModelSize:
    shape: Shape
    weights_bytes: float
    kv_bytes_per_value: float = 2.0  # bfloat16 / float16 cache; fp8 cache is 1


@dataclass(frozen=True)
class Workload:
    context_tokens: int
    sequences: int


@dataclass(frozen=True)
class Hardware:
    gpu_memory_bytes: float
    usable: float = 0.9  # fraction of each GPU given to weights + KV (SGLang mem_fraction_static)
    gpus_per_node: int = 8
    nodes: int | None = None  # nodes on hand (--nodes); None: as many as one engine needs
    nvlink: bool = True  # GPUs in a node joined by NVLink (tensor parallel) or PCIe only


def weights_bytes(params: float, bits_per_weight: float) -> float:
    return params * bits_per_weight / 8


def kv_bytes_per_token(shape: Shape, kv_bytes_per_value: float = 2.0) -> float:
    """KV cache bytes one token holds across all layers: 2 x layers x KV heads x head_dim x
    bytes per value, or layers x the latent width for latent attention."""
    if shape.kv_latent_dim is not None:
        return shape.layers * shape.kv_latent_dim * kv_bytes_per_value
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * kv_bytes_per_value


def kv_bytes_per_token_per_gpu(
    shape: Shape, width: int, kv_bytes_per_value: float = 2.0, *, pipeline: int = 1
) -> float:
    """KV bytes per token on one GPU of a ``width`` tensor group: heads split, copied when
    fewer; ``pipeline`` stages each hold their own layers' share."""
    whole = kv_bytes_per_token(shape, kv_bytes_per_value) / pipeline
    if shape.kv_latent_dim is not None:
        return whole
    return whole / min(width, shape.kv_heads)


def usable_bytes(gpu_memory_bytes: float, usable: float) -> float:
    return gpu_memory_bytes * usable


def minimum_gpus(need_bytes: float, gpu_memory_bytes: float, usable: float) -> int:
    """GPUs to hold ``need_bytes`` at the usable fraction: ceil(need / usable per GPU), >= 1."""
    return max(1, math.ceil(need_bytes / usable_bytes(gpu_memory_bytes, usable) - EPS))


def max_concurrency(kv_budget_bytes: float, kv_bytes_per_sequence: float) -> int:
    """Sequences of full context the budget holds at once: budget // KV bytes per sequence."""
    if kv_bytes_per_sequence <= 0:
        raise ValueError("kv_bytes_per_sequence must be above zero")
    return max(0, math.floor(kv_budget_bytes / kv_bytes_per_sequence + EPS))


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def fits_width(
    model: ModelSize, width: int, kv_tokens: float, per_gpu: float, *, pipeline: int = 1
) -> bool:
    """Whether weights / (width x pipeline) and ``kv_tokens`` of KV cache fit ``per_gpu``
    usable bytes on each GPU of a ``width`` tensor group repeated over ``pipeline`` stages."""
    per_token = kv_bytes_per_token_per_gpu(
        model.shape, width, model.kv_bytes_per_value, pipeline=pipeline
    )
    return model.weights_bytes / (width * pipeline) + kv_tokens * per_token <= per_gpu * (1 + EPS)
