"""``sie-worker size``'s plan for one model on one GPU type: model shape and numbers in, a
:class:`Plan` out. Pure functions, no I/O (the sums are :mod:`sie_worker.sizing.arithmetic`).

- total need = weights + KV per token x context x sequences;
- minimum GPUs = ceil(total need / (GPU memory x usable fraction));
- width = the smallest valid ``tensor_parallel_size`` >= that minimum that also holds the
  KV cache per GPU (:mod:`sie_worker.sizing.width`);
- KV budget of a replica = what the group has left after the weights; concurrency =
  budget / KV per sequence; a chart pool to start from (:mod:`sie_worker.sizing.pool`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from sie_worker.config.widths import MAX_WIDTH, valid_widths
from sie_worker.sizing.arithmetic import (
    EPS,
    Hardware,
    ModelSize,
    Workload,
    fits_width,
    is_power_of_two,
    kv_bytes_per_token,
    kv_bytes_per_token_per_gpu,
    minimum_gpus,
    usable_bytes,
)
from sie_worker.sizing.pool import PoolSuggestion, suggest_pool
from sie_worker.sizing.width import WidthChoice, choose_width

__all__ = ["Plan", "plan", "plan_weights_only"]


@dataclass(frozen=True)
class Plan:
    """``sie-worker size``'s numbers; the KV fields are None when the shape is unknown."""

    weights_bytes: float
    kv_bytes_per_token: float | None
    kv_bytes_per_sequence: float | None
    kv_bytes_total: float | None
    total_bytes: float
    usable_bytes_per_gpu: float
    min_gpus: int
    min_gpus_weights_only: int
    width: WidthChoice
    weights_bytes_per_gpu: float | None
    kv_budget_bytes_per_replica: float | None
    kv_budget_tokens_per_replica: int | None
    concurrency_per_replica: int | None
    replicas_per_node: int | None
    pool: PoolSuggestion | None


def plan(model: ModelSize, workload: Workload, hardware: Hardware) -> Plan:
    """Everything ``sie-worker size`` prints, for one model on one GPU type."""
    per_token = kv_bytes_per_token(model.shape, model.kv_bytes_per_value)
    per_sequence = per_token * workload.context_tokens
    kv_tokens = workload.context_tokens * workload.sequences
    kv_total = per_token * kv_tokens
    total = model.weights_bytes + kv_total
    per_gpu = usable_bytes(hardware.gpu_memory_bytes, hardware.usable)
    min_gpus = minimum_gpus(total, hardware.gpu_memory_bytes, hardware.usable)
    fits = tuple(
        w
        for w in valid_widths(model.shape.attention_heads, model.shape.kv_heads)
        if fits_width(model, w, kv_tokens, per_gpu)
    )
    choice = choose_width(min_gpus, model.shape, gpus_per_node=hardware.gpus_per_node, fits=fits)
    base = Plan(
        weights_bytes=model.weights_bytes,
        kv_bytes_per_token=per_token,
        kv_bytes_per_sequence=per_sequence,
        kv_bytes_total=kv_total,
        total_bytes=total,
        usable_bytes_per_gpu=per_gpu,
        min_gpus=min_gpus,
        min_gpus_weights_only=minimum_gpus(
            model.weights_bytes, hardware.gpu_memory_bytes, hardware.usable
        ),
        width=choice,
        weights_bytes_per_gpu=None,
        kv_budget_bytes_per_replica=None,
        kv_budget_tokens_per_replica=None,
        concurrency_per_replica=None,
        replicas_per_node=None,
        pool=None,
    )
    width = choice.width
    if width is None:
        return base
    left_per_gpu = per_gpu - model.weights_bytes / width
    tokens = math.floor(
        left_per_gpu / kv_bytes_per_token_per_gpu(model.shape, width, model.kv_bytes_per_value)
        + EPS
    )
    return replace(
        base,
        weights_bytes_per_gpu=model.weights_bytes / width,
        kv_budget_bytes_per_replica=left_per_gpu * width,
        kv_budget_tokens_per_replica=tokens,
        concurrency_per_replica=tokens // workload.context_tokens,
        replicas_per_node=hardware.gpus_per_node // width,
        pool=suggest_pool(width, model.weights_bytes),
    )


def plan_weights_only(model_weights_bytes: float, hardware: Hardware) -> Plan:
    """The plan without a config.json: weights only, the width the smallest power of two that
    holds them.

    Head counts are unknown, so the width is not checked against them and the KV cache is
    not counted; the reason says so.
    """
    per_gpu = usable_bytes(hardware.gpu_memory_bytes, hardware.usable)
    min_gpus = minimum_gpus(model_weights_bytes, hardware.gpu_memory_bytes, hardware.usable)
    powers = tuple(w for w in range(1, MAX_WIDTH + 1) if is_power_of_two(w))
    width = next((w for w in powers if w >= min_gpus), None)
    unknown = "no config.json, so head counts and KV cache are unknown"
    reason = (
        f"weights need {min_gpus} GPU{'s' if min_gpus > 1 else ''}; {unknown}: {width} is the "
        "smallest power of two that holds the weights; check that it divides the attention "
        "heads and leaves room for the KV cache"
        if width is not None
        else f"weights alone need {min_gpus} GPUs, more than the {MAX_WIDTH} one engine can "
        "span: use fewer bits per weight or GPUs with more memory"
    )
    pool = None if width is None else suggest_pool(width, model_weights_bytes)
    return Plan(
        weights_bytes=model_weights_bytes,
        kv_bytes_per_token=None,
        kv_bytes_per_sequence=None,
        kv_bytes_total=None,
        total_bytes=model_weights_bytes,
        usable_bytes_per_gpu=per_gpu,
        min_gpus=min_gpus,
        min_gpus_weights_only=min_gpus,
        width=WidthChoice(width, reason, ()),
        weights_bytes_per_gpu=None if width is None else model_weights_bytes / width,
        kv_budget_bytes_per_replica=None
        if width is None
        else per_gpu * width - model_weights_bytes,
        kv_budget_tokens_per_replica=None,
        concurrency_per_replica=None,
        replicas_per_node=None if width is None else hardware.gpus_per_node // width,
        pool=pool,
    )
