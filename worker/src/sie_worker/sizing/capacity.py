"""Capacity planning for one served model: config + config.json + GPU -> sizing inputs.

The glue between :mod:`sie_worker.config` (the profile), :mod:`sie_worker.sizing.model_stats`
(what the model directory says) and the pure arithmetic of :mod:`sie_worker.sizing.arithmetic`.
``sie-worker size`` uses all of it; ``validate``/``plan`` need only
:func:`add_gpu_arguments`, :func:`hardware_from_args` and :func:`served_model_warnings`.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass

from sie_worker.config.flags.option_tables import option_tables, resolve
from sie_worker.config.load.load_options import declared_width
from sie_worker.config.load.model_shape import ModelPathError, find_config_json
from sie_worker.config.model import ServedModel
from sie_worker.config.widths import stages_problem
from sie_worker.errors import Problem
from sie_worker.sizing.arithmetic import Hardware, ModelSize, Workload
from sie_worker.sizing.config_warnings import config_warnings
from sie_worker.sizing.gpus import GpuError, gpu_memory_for_type, known_types, parse_memory
from sie_worker.sizing.model_stats import (
    ModelStats,
    ModelStatsError,
    Weights,
    read_model_stats,
    resolve_weights,
)

__all__ = [
    "GPU_TYPE_ENV",
    "Gpu",
    "WorkloadChoice",
    "add_gpu_arguments",
    "declared_split",
    "gpu_from",
    "hardware_for",
    "hardware_from_args",
    "kv_bytes_per_value",
    "served_model_warnings",
    "warnings_for",
    "whole_number",
    "workload_for",
]

GPU_TYPE_ENV = "SIE_GPU_TYPE"  # the chart sets it from the pool's gpuType
_KV_BYTES = {"fp8": 1.0, "fp4": 0.5, "int8": 1.0, "bf16": 2.0, "bfloat16": 2.0, "fp16": 2.0,
             "float16": 2.0, "half": 2.0, "fp32": 4.0, "float32": 4.0}  # fmt: skip


@dataclass(frozen=True)
class Gpu:
    memory_bytes: int
    type: str | None  # None when given as --gpu-memory
    source: str


@dataclass(frozen=True)
class WorkloadChoice:
    workload: Workload
    context_source: str
    sequences_source: str


def add_gpu_arguments(parser: argparse.ArgumentParser, *, per_node: bool = True) -> None:
    """``--gpu-type`` / ``--gpu-memory`` / ``--usable``, and ``--gpus-per-node``, ``--nodes``
    and ``--interconnect`` when ``per_node`` (the layout matters to ``size`` only)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--gpu-type",
        metavar="TYPE",
        help=f"GPU model (default: ${GPU_TYPE_ENV}); one of: {known_types()}",
    )
    group.add_argument(
        "--gpu-memory",
        metavar="SIZE",
        help="memory of one GPU, e.g. 80GB (1e9 bytes), 80GiB; a bare number is GB",
    )
    parser.add_argument(
        "--usable",
        type=_fraction,
        default=0.9,
        metavar="F",
        help="fraction of each GPU for weights + KV cache (default 0.9)",
    )
    if per_node:
        parser.add_argument(
            "--gpus-per-node",
            type=whole_number,
            default=8,
            metavar="N",
            help="GPUs in one node: tensor parallel stays inside one; replicas per node "
            "(default 8)",
        )
        parser.add_argument(
            "--nodes",
            type=_nodes,
            metavar="N",
            help="nodes on hand: a model fits when one engine's nodes are at most N, and the "
            "rest hold replicas (default: the nodes one engine needs)",
        )
        parser.add_argument(
            "--interconnect",
            choices=("nvlink", "pcie"),
            default="nvlink",
            help="how a node's GPUs are joined: nvlink splits a model inside a node by tensor "
            "parallel, pcie by pipeline stages (default: nvlink)",
        )


def gpu_from(
    gpu_type: str | None, gpu_memory: str | None, env: Mapping[str, str] | None = None
) -> Gpu | None:
    """The GPU the flags (else ``$SIE_GPU_TYPE``) name; None when nothing names one.

    Raises :class:`~sie_worker.sizing.gpus.GpuError` for an unknown type or unreadable size.
    """
    if gpu_memory is not None:
        return Gpu(parse_memory(gpu_memory), None, "--gpu-memory")
    if gpu_type is not None:
        return Gpu(gpu_memory_for_type(gpu_type), gpu_type.strip().lower(), "--gpu-type")
    from_env = (os.environ if env is None else env).get(GPU_TYPE_ENV, "").strip()
    if from_env:
        try:
            return Gpu(gpu_memory_for_type(from_env), from_env.lower(), GPU_TYPE_ENV)
        except GpuError as exc:
            raise GpuError(f"{GPU_TYPE_ENV}: {exc}") from None
    return None


def hardware_from_args(
    args: argparse.Namespace, env: Mapping[str, str] | None = None
) -> Hardware | None:
    """Hardware from :func:`add_gpu_arguments`' flags; None when no GPU is named."""
    gpu = gpu_from(args.gpu_type, args.gpu_memory, env)
    return None if gpu is None else hardware_for(gpu, args)


def hardware_for(gpu: Gpu, args: argparse.Namespace) -> Hardware:
    """The :class:`Hardware` of ``gpu`` with :func:`add_gpu_arguments`' other flags."""
    return Hardware(
        gpu.memory_bytes,
        args.usable,
        getattr(args, "gpus_per_node", 8),
        nodes=getattr(args, "nodes", None),
        nvlink=getattr(args, "interconnect", "nvlink") == "nvlink",
    )


def kv_bytes_per_value(served: ServedModel) -> tuple[float, str]:
    """Bytes of one cached K or V value: ``--kv-cache-dtype`` in extra_launch_args, else
    the profile's compute_precision, else 2 (SGLang caches in the model's 16-bit dtype)."""
    args = served.profile.extra_launch_args
    table = option_tables()[0]
    for i, token in enumerate(args):
        if resolve(token, table).dest != "kv_cache_dtype":
            continue
        value = (
            token.split("=", 1)[1] if "=" in token else (args[i + 1] if i + 1 < len(args) else "")
        )
        for prefix, size in _KV_BYTES.items():
            if value.lower().startswith(prefix):
                return size, f"--kv-cache-dtype {value}"
    precision = (served.profile.compute_precision or "").lower()
    if precision in _KV_BYTES:
        return _KV_BYTES[precision], f"compute_precision {precision}"
    return 2.0, "default (16-bit cache)"


def workload_for(
    served: ServedModel,
    stats: ModelStats | None,
    *,
    context: int | None = None,
    sequences: int | None = None,
) -> WorkloadChoice:
    """Context and sequences: the flags, else ``tasks.*.context_length`` /
    ``max_sequence_length`` (else config.json's ``max_position_embeddings``), and
    ``kv_budget_tokens // context`` sequences (else 1)."""
    context_source = "--context"
    if context is None:
        context, context_source = _config_context(served, stats)
    sequences_source = "--sequences"
    budget = served.profile.kv_budget_tokens
    if sequences is None:
        if budget:
            sequences, sequences_source = max(1, budget // context), "kv_budget_tokens / context"
        else:
            sequences, sequences_source = 1, "default (no kv_budget_tokens)"
    return WorkloadChoice(Workload(context, sequences), context_source, sequences_source)


def _config_context(served: ServedModel, stats: ModelStats | None) -> tuple[int, str]:
    # A profile's loadtime.max_seq_length is its served model's context (SIE's variants).
    candidates = (
        (served.profile.loadtime.get("max_seq_length"), "adapter_options.loadtime.max_seq_length"),
        (served.config.generate.get("context_length"), "tasks.generate.context_length"),
        (served.config.max_sequence_length, "max_sequence_length"),
    )
    for value, source in candidates:
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value, source
    if stats is not None and stats.max_position_embeddings:
        return stats.max_position_embeddings, "config.json max_position_embeddings"
    raise ModelStatsError(
        f"{served.id}: no context length in tasks.generate.context_length or config.json; "
        "pass --context, e.g. --context 8192"
    )


def served_model_warnings(
    served: ServedModel,
    hardware: Hardware,
    *,
    devices: int | None = None,
    env: Mapping[str, str] | None = None,
) -> list[Problem]:
    """The capacity warnings for a served model's declared width and KV budget.

    Like the head-count check, they need the model's config.json (local dir or HF cache)
    and a weights figure from its safetensors files; without them there is nothing to
    check and the list is empty. Problems carry the config's file.
    """
    try:
        path = find_config_json(served.config, env)
        if path is None:
            return []
        stats = read_model_stats(path)
        weights = resolve_weights(stats, compute_precision=served.profile.compute_precision)
    except (ModelPathError, ModelStatsError):
        return []
    return warnings_for(served, stats, weights, hardware, devices=devices)


def warnings_for(
    served: ServedModel,
    stats: ModelStats,
    weights: Weights,
    hardware: Hardware,
    *,
    devices: int | None = None,
    context: int | None = None,
) -> list[Problem]:
    """:func:`~sie_worker.sizing.config_warnings.config_warnings` for the declared values."""
    kv_bytes, _ = kv_bytes_per_value(served)
    model = ModelSize(stats.shape, weights.bytes, kv_bytes)
    tensor, stages = declared_split(served)
    if context is None:
        try:
            context = _config_context(served, stats)[0]
        except ModelStatsError:
            context = None
    problems = config_warnings(
        model,
        width=tensor,
        stages=stages,
        kv_budget_tokens=served.profile.kv_budget_tokens,
        context_tokens=context,
        hardware=hardware,
        devices=devices,
        profile=served.profile.name,
        loadtime_profile=served.profile.loadtime_from,
    )
    return [Problem(p.path, p.message, served.config.source) for p in problems]


def declared_split(served: ServedModel) -> tuple[int, int]:
    """The declared (tensor_parallel_size, pipeline_parallel_size), 1 for what is absent or
    invalid (the load-time checks report those)."""
    stages = served.profile.loadtime.get("pipeline_parallel_size", 1)
    stages = stages if stages_problem(stages) is None else 1
    return declared_width(served) // stages, stages


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a fraction above 0 and at most 1, e.g. 0.9")
    return value


def _nodes(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number of nodes, at least 1, e.g. 2")
    return value


def whole_number(text: str) -> int:
    """An argparse type: a whole number of at least 1; ``_`` and ``,`` may group digits."""
    try:
        value = int(text.replace("_", "").replace(",", ""))
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number of at least 1, e.g. 8192")
    return value
