"""``sie-worker size``'s plan for one model on one GPU type: model shape and numbers in, a
:class:`Plan` out. Pure functions, no I/O (the sums are :mod:`sie_worker.sizing.arithmetic`).

- total need = weights + KV per token x context x sequences;
- minimum GPUs = ceil(total need / (GPU memory x usable fraction));
- width = the smallest valid ``tensor_parallel_size`` >= that minimum that also holds the
  KV cache per GPU (:mod:`sie_worker.sizing.width`); without one, the smallest TP x PP
  inside a node, and beyond one node, tensor parallel inside a node and pipeline stages
  across nodes (:mod:`sie_worker.sizing.layout`), the width then being TP x PP;
- KV budget of a replica = what the group has left after the weights; concurrency =
  budget / KV per sequence; a chart pool to start from (:mod:`sie_worker.sizing.pool`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from sie_worker.config.widths import MAX_WIDTH, model_width, valid_widths
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
from sie_worker.sizing.layout import Layout, choose_layout
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
    replicas_per_node: int | None  # None for a group of nodes
    pool: PoolSuggestion | None
    layout: Layout


def plan(model: ModelSize, workload: Workload, hardware: Hardware, *, moe: bool = False) -> Plan:
    """Everything ``sie-worker size`` prints, for one model on one GPU type."""
    per_token = kv_bytes_per_token(model.shape, model.kv_bytes_per_value)
    per_sequence = per_token * workload.context_tokens
    kv_tokens = workload.context_tokens * workload.sequences
    kv_total = per_token * kv_tokens
    total = model.weights_bytes + kv_total
    per_gpu = usable_bytes(hardware.gpu_memory_bytes, hardware.usable)
    min_gpus = minimum_gpus(total, hardware.gpu_memory_bytes, hardware.usable)
    valid = valid_widths(model.shape.attention_heads, model.shape.kv_heads)
    fits = tuple(w for w in valid if fits_width(model, w, kv_tokens, per_gpu))
    choice = choose_width(min_gpus, model.shape, gpus_per_node=hardware.gpus_per_node, fits=fits)
    layout = choose_layout(
        min_gpus,
        choice.width,
        hardware,
        tensor_widths=valid,
        fits=lambda tp, pp: fits_width(model, tp, kv_tokens, per_gpu, pipeline=pp),
        width_reason=choice.reason,
        layers=model.shape.layers,
        moe=moe,
    )
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
        width=WidthChoice(layout.width, layout.reason, choice.valid),
        weights_bytes_per_gpu=None,
        kv_budget_bytes_per_replica=None,
        kv_budget_tokens_per_replica=None,
        concurrency_per_replica=None,
        replicas_per_node=None,
        pool=None,
        layout=layout,
    )
    width, tp, pp = layout.width, layout.tensor_parallel_size, layout.pipeline_parallel_size
    if width is None or tp is None or pp is None:
        return base
    left_per_gpu = per_gpu - model.weights_bytes / width
    per_token = kv_bytes_per_token_per_gpu(model.shape, tp, model.kv_bytes_per_value, pipeline=pp)
    tokens = math.floor(left_per_gpu / per_token + EPS)
    return replace(
        _with_replica(base, width),
        concurrency_per_replica=tokens // workload.context_tokens,
        kv_budget_tokens_per_replica=tokens,
    )


def _with_replica(base: Plan, width: int) -> Plan:
    """``base`` with the fields that the weights and the layout's ``width`` decide."""
    weights, nodes = base.weights_bytes, base.layout.nodes or 1
    return replace(
        base,
        weights_bytes_per_gpu=weights / width,
        kv_budget_bytes_per_replica=base.usable_bytes_per_gpu * width - weights,
        replicas_per_node=base.layout.gpus_per_node // width if nodes == 1 else None,
        pool=suggest_pool(width, weights, nodes=nodes),
    )


def plan_weights_only(model_weights_bytes: float, hardware: Hardware, *, moe: bool = False) -> Plan:
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
        else ""  # beyond 8 GPUs: the layout's reason (a group of nodes, or why none holds it)
    )
    layout = choose_layout(
        min_gpus,
        width,
        hardware,
        tensor_widths=powers,
        fits=lambda tp, pp: model_weights_bytes / model_width(tp, pp) <= per_gpu * (1 + EPS),
        width_reason=reason,
        moe=moe,
    )
    if layout.width is not None and layout.reason != reason:
        heads = "TP divides the attention heads and " if layout.tensor_parallel_size != 1 else ""
        layout = replace(layout, reason=f"{layout.reason}; {unknown}: check that {heads}the "
                         "split leaves room for the KV cache")  # fmt: skip
    base = Plan(
        weights_bytes=model_weights_bytes,
        kv_bytes_per_token=None,
        kv_bytes_per_sequence=None,
        kv_bytes_total=None,
        total_bytes=model_weights_bytes,
        usable_bytes_per_gpu=per_gpu,
        min_gpus=min_gpus,
        min_gpus_weights_only=min_gpus,
        width=WidthChoice(layout.width, layout.reason, ()),
        weights_bytes_per_gpu=None,
        kv_budget_bytes_per_replica=None,
        kv_budget_tokens_per_replica=None,
        concurrency_per_replica=None,
        replicas_per_node=None,
        pool=None,
        layout=layout,
    )
    return base if layout.width is None else _with_replica(base, layout.width)
