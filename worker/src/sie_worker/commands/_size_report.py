"""What ``sie-worker size`` prints: the report, as JSON and as an 80-column table.

JSON units: every ``*_bytes`` field is an integer number of bytes; tokens and counts are
integers; the table shows GB (1e9 bytes) and KiB. The fields are documented in the
README's "Sizing" section; keep the two in step.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Any

from sie_worker.commands._size_pool import layout_json, pool_json, pool_lines
from sie_worker.config.model import ServedModel
from sie_worker.errors import Problem
from sie_worker.sizing.arithmetic import Hardware
from sie_worker.sizing.capacity import Gpu, WorkloadChoice, declared_split
from sie_worker.sizing.cold_start import (
    DEFAULT_SOURCES,
    DEFAULT_STARTUP_S,
    DEFAULT_WARMUP_S,
    ColdStart,
    WeightSource,
    backlog,
    backlog_line,
    cold_starts,
    table_lines,
)
from sie_worker.sizing.layout import layout_summary
from sie_worker.sizing.lora import LoraSizing
from sie_worker.sizing.model_stats import ModelStats, Weights
from sie_worker.sizing.plan import Plan

__all__ = ["ColdStartInputs", "Report", "to_json", "to_table"]

_WIDTH = 80
_LABEL = 14


@dataclass(frozen=True)
class ColdStartInputs:
    sources: tuple[WeightSource, ...] = DEFAULT_SOURCES
    startup_s: float = DEFAULT_STARTUP_S
    warmup_s: float = DEFAULT_WARMUP_S
    arrival_rate: float | None = None  # None: no backlog
    served_rate: float = 0.0


@dataclass(frozen=True)
class Report:
    served: ServedModel
    declared_width: int
    stats: ModelStats | None  # None: no config.json, a weights-only plan
    weights: Weights
    kv_bytes_per_value: float | None
    kv_source: str | None
    gpu: Gpu
    hardware: Hardware
    workload: WorkloadChoice | None
    plan: Plan
    warnings: list[Problem]
    cold_start: ColdStartInputs = ColdStartInputs()
    lora: LoraSizing | None = None  # the profile's LoRA adapters, when it declares any
    moe: tuple[bool, str] = (False, "")  # mixture of experts?, and why (flag or config.json)

    def cold_starts(self) -> list[ColdStart]:
        cold = self.cold_start
        return cold_starts(
            [(self.served.id, self.weights.bytes)],
            cold.sources,
            startup_s=cold.startup_s,
            warmup_s=cold.warmup_s,
        )


def _int(value: float | None) -> int | None:
    return None if value is None else round(value)


def to_json(report: Report) -> dict[str, Any]:
    stats, plan, hw, work = report.stats, report.plan, report.hardware, report.workload
    shape = stats.shape if stats else None
    return {
        "model": report.served.id,
        "profile": report.served.profile.name,
        "config_file": report.served.config.source,
        "config_json": str(stats.config_path) if stats else None,
        "shape": None
        if shape is None
        else {
            "layers": shape.layers,
            "attention_heads": shape.attention_heads,
            "kv_heads": shape.kv_heads,
            "head_dim": shape.head_dim,
            "kv_latent_dim": shape.kv_latent_dim,
            "experts": stats.experts if stats else None,
        },
        "moe": report.moe[0],
        "moe_source": report.moe[1],
        "params": _int(report.weights.params),
        "params_source": report.weights.params_source,
        "bits_per_weight": report.weights.bits_per_weight,
        "bits_source": report.weights.bits_source,
        "kv_bytes_per_value": report.kv_bytes_per_value,
        "kv_bytes_per_value_source": report.kv_source,
        "gpu": {
            "type": report.gpu.type,
            "source": report.gpu.source,
            "memory_bytes": report.gpu.memory_bytes,
            "usable_fraction": hw.usable,
            "usable_bytes": _int(plan.usable_bytes_per_gpu),
            "gpus_per_node": hw.gpus_per_node,
        },
        "context_tokens": work.workload.context_tokens if work else None,
        "context_source": work.context_source if work else None,
        "sequences": work.workload.sequences if work else None,
        "sequences_source": work.sequences_source if work else None,
        "weights_bytes": _int(report.weights.bytes),
        "weights_source": report.weights.source,
        "lora": _lora_json(report.lora),
        "kv_bytes_per_token": _int(plan.kv_bytes_per_token),
        "kv_bytes_per_sequence": _int(plan.kv_bytes_per_sequence),
        "kv_bytes_total": _int(plan.kv_bytes_total),
        "total_bytes": _int(plan.total_bytes),
        "min_gpus": plan.min_gpus,
        "min_gpus_weights_only": plan.min_gpus_weights_only,
        "width": plan.width.width,
        "width_reason": plan.width.reason,
        "valid_widths": list(plan.width.valid) if stats else None,
        "weights_bytes_per_gpu": _int(plan.weights_bytes_per_gpu),
        "kv_budget_bytes_per_replica": _int(plan.kv_budget_bytes_per_replica),
        "kv_budget_tokens_per_replica": plan.kv_budget_tokens_per_replica,
        "concurrency_per_replica": plan.concurrency_per_replica,
        "replicas_per_node": plan.replicas_per_node,
        "pool": pool_json(plan.pool),
        "layout": layout_json(plan.layout),
        "declared": {
            "tensor_parallel_size": declared_split(report.served)[0],
            "pipeline_parallel_size": declared_split(report.served)[1],
            "kv_budget_tokens": report.served.profile.kv_budget_tokens,
        },
        "warnings": [{"path": w.path, "message": w.message} for w in report.warnings],
        "cold_start": _cold_json(report),
    }


def _cold_json(report: Report) -> dict[str, Any]:
    cold = report.cold_start
    return {
        "startup_s": cold.startup_s,
        "warmup_s": cold.warmup_s,
        "weights_bytes": _int(report.weights.bytes),
        "arrival_rate": cold.arrival_rate,
        "served_rate": cold.served_rate if cold.arrival_rate is not None else None,
        "sources": [
            {
                "source": row.source.label,
                "bytes_per_second": row.source.bytes_per_second,
                "load_s": row.load_s,
                "total_s": row.total_s,
                "backlog_requests": None
                if cold.arrival_rate is None
                else backlog(cold.arrival_rate, cold.served_rate, row.total_s),
            }
            for row in report.cold_starts()
        ],
    }


def _lora_json(lora: LoraSizing | None) -> dict[str, Any] | None:
    if lora is None:
        return None
    return {
        "adapters": lora.adapters,
        "rank": lora.rank,
        "rank_source": lora.rank_source,
        "modules": list(lora.modules),
        "params_per_rank_per_layer": lora.params_per_rank_per_layer,
        "adapter_params": lora.adapter_params,
        "adapter_bytes": _int(lora.adapter_bytes),
        "max_loras_per_batch": lora.slots,
        "max_rank": lora.max_rank,
        "max_rank_source": lora.max_rank_source,
        "buffer_bytes": _int(lora.buffer_bytes),
        "merged_bytes": _int(lora.merged_bytes),
        "shared_bytes": _int(lora.shared_bytes),
    }


def _lora_rows(lora: LoraSizing) -> list[tuple[str, str]]:
    """The seed's figures: one adapter, the engine's buffers, merged against shared."""
    return [
        (
            "LoRA",
            f"{lora.adapters} adapter(s) of rank {lora.rank} ({lora.rank_source}) on "
            f"{len(lora.modules)} module(s): {_n(lora.params_per_rank_per_layer)} parameters "
            f"per rank per layer; {_n(lora.adapter_params)} parameters, "
            f"{lora.adapter_bytes / 1e6:,.1f} MB per adapter",
        ),
        (
            "LoRA buffers",
            f"{lora.buffer_bytes / 1e9:,.2f} GB of GPU memory for --max-loras-per-batch "
            f"{lora.slots} at rank {lora.max_rank} ({lora.max_rank_source}), counted in the "
            "total need (the KV cache does not get it)",
        ),
        (
            "LoRA variants",
            f"{lora.adapters} fine-tuned variants: {_gb(lora.merged_bytes)} as merged models, "
            f"{_gb(lora.shared_bytes)} as one base plus the adapters",
        ),
    ]


def _cold_lines(report: Report) -> list[str]:
    """The seed's cold-start table and backlog lines, unindented, exactly as it prints them."""
    cold = report.cold_start
    rows = report.cold_starts()
    lines = [
        f"cold start: {cold.startup_s:g} s start + weights / source rate + {cold.warmup_s:g} s",
        "warm-up (assumed rates: measure yours)",
        *table_lines(rows),
    ]
    if cold.arrival_rate is not None:
        lines.append(
            f"backlog ({cold.arrival_rate:g} requests/s arriving, {cold.served_rate:g}/s served "
            "by the ready replicas):"
        )
        lines += [
            backlog_line(row.total_s, backlog(cold.arrival_rate, cold.served_rate, row.total_s))
            for row in rows
        ]
    return lines


def _gb(n: float) -> str:
    return f"{n / 1e9:,.1f} GB"


def _n(n: int) -> str:
    return f"{n:,}"


def _rows(report: Report) -> list[tuple[str, str]]:
    stats, plan, hw, work, w = (
        report.stats,
        report.plan,
        report.hardware,
        report.workload,
        report.weights,
    )
    rows: list[tuple[str, str]] = []
    if stats:
        s = stats.shape
        attention = (
            f"latent {s.kv_latent_dim}"
            if s.kv_latent_dim
            else f"{s.kv_heads} KV heads, head_dim {s.head_dim}"
        )
        experts = f", {stats.experts} routed experts" if stats.experts else ""
        rows.append(
            (
                "shape",
                f"{s.layers} layers, {s.attention_heads} attention heads, {attention}{experts}",
            )
        )
    else:
        rows.append(("shape", "unknown (no config.json): weights only"))
    how = (
        f"{w.params / 1e9:,.2f}B params x {w.bits_per_weight:g} bits"
        if w.params and w.bits_per_weight
        else ""
    )
    rows.append(("weights", f"{_gb(w.bytes)}  ({', '.join(x for x in (how, w.source) if x)})"))
    if report.lora is not None:
        rows += _lora_rows(report.lora)
    if work and plan.kv_bytes_per_token and plan.kv_bytes_per_sequence and plan.kv_bytes_total:
        ctx, seqs = work.workload.context_tokens, work.workload.sequences
        rows.append(
            (
                "KV cache",
                f"{plan.kv_bytes_per_token / 1024:,.0f} KiB per token "
                f"({report.kv_bytes_per_value:g} bytes per value, {report.kv_source}); "
                f"{_gb(plan.kv_bytes_per_sequence)} per {_n(ctx)}-token sequence; "
                f"{_gb(plan.kv_bytes_total)} for {_n(seqs)} "
                f"({work.context_source}; {work.sequences_source})",
            )
        )
    rows.append(("total need", _gb(plan.total_bytes)))
    gpu = report.gpu
    rows.append(
        (
            "GPU",
            f"{gpu.type or 'custom'}, {_gb(gpu.memory_bytes)} ({gpu.source}); "
            f"{_gb(plan.usable_bytes_per_gpu)} usable at {hw.usable:g}; "
            f"{hw.gpus_per_node} per node",
        )
    )
    rows.append(
        ("min GPUs", f"{plan.min_gpus} ({plan.min_gpus_weights_only} for the weights alone)")
    )
    width = plan.width.width
    valid = f" Valid widths: {', '.join(map(str, plan.width.valid))}." if plan.width.valid else ""
    rows.append(("width", f"{width if width else 'none'}: {plan.width.reason}.{valid}"))
    if width and plan.weights_bytes_per_gpu is not None:
        buffers = " and LoRA buffers" if report.lora is not None else ""
        rows.append(("per GPU", f"{_gb(plan.weights_bytes_per_gpu)} of weights{buffers}"))
    if plan.kv_budget_bytes_per_replica is not None:
        budget = f"{_gb(plan.kv_budget_bytes_per_replica)} of KV budget"
        if plan.kv_budget_tokens_per_replica is not None and work:
            budget += (
                f" = {_n(plan.kv_budget_tokens_per_replica)} tokens = "
                f"{_n(plan.concurrency_per_replica or 0)} sequences of "
                f"{_n(work.workload.context_tokens)} at once"
            )
        rows.append(("per replica", budget))
    if plan.replicas_per_node is not None:
        rows.append(("per node", f"{plan.replicas_per_node} replica(s) of width {width}"))
    rows.append(("layout", layout_summary(plan.layout)))
    if report.moe[0]:
        rows.append(("MoE", f"yes ({report.moe[1]}): a split adds expert parallel"))
    tensor, stages = declared_split(report.served)
    declared = f"tensor_parallel_size {tensor}"
    if stages > 1:
        declared += f", pipeline_parallel_size {stages}"
    if report.served.profile.kv_budget_tokens is not None:
        declared += f", kv_budget_tokens {_n(report.served.profile.kv_budget_tokens)}"
    rows.append(("declared", declared))
    return rows


def to_table(report: Report) -> str:
    """The report as label/value rows wrapped to 80 columns, the pool, then warnings."""
    lines = [f"{report.served.id} (profile {report.served.profile.name})"]
    indent = " " * _LABEL
    for label, text in _rows(report):
        lines += textwrap.wrap(
            text,
            _WIDTH,
            initial_indent=label.ljust(_LABEL),
            subsequent_indent=indent,
            break_on_hyphens=False,
        )
    lines += pool_lines(report.plan.pool, report.plan.layout)
    lines += _cold_lines(report)
    for warning in report.warnings:
        lines += textwrap.wrap(
            f"{warning.path}: {warning.message}",
            _WIDTH,
            initial_indent="warning: ",
            subsequent_indent="         ",
            break_on_hyphens=False,
        )
    return "\n".join(lines)
