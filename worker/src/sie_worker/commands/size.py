"""``sie-worker size FILE [FILE ...]``: capacity plan for served models on one GPU type.

Reads the model config, then the model's config.json (``model_path`` or the Hugging Face
cache, as for the head check; ``--model-dir`` points elsewhere) and its safetensors
headers or index for the weights. Prints weights, KV cache per token and per sequence,
total need, the minimum GPUs at the usable fraction, the width to declare (valid for the
head counts, powers of two preferred), the layout (seed 004: tensor parallel inside a node,
pipeline stages over PCIe and across nodes, the smallest TP x PP inside a node when no width
alone holds it; --nodes, --interconnect, --moe or config.json's expert count), the KV budget
and concurrency of one replica, replicas per node, a chart pool to start from (with
gpu.nodes and the load options for a split by stages), warnings about the declared width and
kv_budget_tokens, and the cold start of a new replica by weight source (container start +
weights / source rate + warm-up; --source, --startup-s, --warmup-s), with the requests that
pile up meanwhile at --arrival-rate beyond --served-rate; with ``lora_paths``, the adapters'
memory (one adapter at its rank, the engine's GPU buffers for max_loras_per_batch adapters,
counted in the total need, and the fine-tunes as merged models against one base plus
adapters; --lora-rank). With several files, which single-GPU models fit together on one
GPU: the mem_fraction_static each should declare (its need over the GPU's memory, unless
declared), what the worker reserves for it, and the --mem-fraction-static it passes each
engine in that load order (``SIE_MEMORY_PRESSURE_THRESHOLD_PERCENT`` sets the budget).
``--json`` prints the same fields (with several files: ``{"models": [...], "sharing":
{...}}``) (README: "Sizing"). Units: bytes, and
GB = 1e9 bytes. Exit 1 on bad input (unreadable config, no config.json and no --params,
unknown GPU type).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from sie_server.adapters.base import EngineKind
from sie_worker.commands import _size_args, _size_report, _size_sharing
from sie_worker.config.adapters import NotServedHere, UnknownAdapter
from sie_worker.config.files.reader import load_config_file
from sie_worker.config.load.load_options import adapter_of, declared_width
from sie_worker.config.load.model_shape import ModelPathError, find_config_json, local_model_dir
from sie_worker.config.model import DEFAULT_PROFILE, ServedModel, served_model
from sie_worker.engines.registry import PRODUCT_FAMILY, family_of
from sie_worker.errors import InvalidConfig, Problem
from sie_worker.settings import Settings, SettingsError
from sie_worker.sizing.arithmetic import Hardware, ModelSize
from sie_worker.sizing.capacity import (
    GPU_TYPE_ENV,
    Gpu,
    add_gpu_arguments,
    gpu_from,
    hardware_for,
    kv_bytes_per_value,
    warnings_for,
    whole_number,
    workload_for,
)
from sie_worker.sizing.cold_start import (
    DEFAULT_SOURCES,
    DEFAULT_STARTUP_S,
    DEFAULT_WARMUP_S,
)
from sie_worker.sizing.gpus import GpuError, known_types
from sie_worker.sizing.lora_inputs import lora_for
from sie_worker.sizing.model_stats import (
    ModelStats,
    ModelStatsError,
    Weights,
    read_model_stats,
    resolve_weights,
)
from sie_worker.sizing.packing import Packing, Tenant, pack
from sie_worker.sizing.plan import plan, plan_weights_only

__all__ = ["register", "run"]


class _SizeError(Exception):
    """Bad input: printed as ``sie-worker size: <message>``, exit 1."""


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "size",
        help="capacity plan: weights, KV cache, minimum GPUs, width, replicas",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
    )
    parser.add_argument(
        "files",
        metavar="FILE",
        type=Path,
        nargs="+",
        help="model config file; several: also which of them share a GPU",
    )
    parser.add_argument(
        "--profile", default=DEFAULT_PROFILE, help="profile to size (default: default)"
    )
    add_gpu_arguments(parser)
    parser.add_argument(
        "--moe",
        action=argparse.BooleanOptionalAction,
        help="a mixture-of-experts model (--no-moe: a dense one): a split model adds expert "
        "parallel for its MoE layers (default: an expert count in config.json)",
    )
    parser.add_argument(
        "--context",
        type=whole_number,
        metavar="N",
        help=(
            "tokens per sequence (default: loadtime.max_seq_length, else "
            "tasks.generate.context_length)"
        ),
    )
    parser.add_argument(
        "--sequences",
        type=whole_number,
        metavar="N",
        help="sequences held at once (default: kv_budget_tokens / context, else 1)",
    )
    parser.add_argument(
        "--params",
        type=_size_args.params,
        metavar="N",
        help="parameter count, e.g. 70.6B or 7e9 (default: from the safetensors files)",
    )
    parser.add_argument(
        "--bits",
        type=_size_args.bits,
        metavar="B",
        help="bits per weight, e.g. 16, 8, 4.5 (default: the config.json dtype/quantization)",
    )
    parser.add_argument(
        "--lora-rank",
        type=whole_number,
        metavar="R",
        help="rank of the profile's LoRA adapters (default: the largest r of their "
        "adapter_config.json, else 16)",
    )
    parser.add_argument(
        "--model-dir",
        type=Path,
        metavar="DIR",
        help="folder holding config.json (default: model_path, else the Hugging Face cache)",
    )
    cold = parser.add_argument_group(
        "cold start", "how long a new replica takes to serve, by where its weights come from"
    )
    cold.add_argument(
        "--source",
        action="append",
        type=_size_args.source,
        metavar="LABEL=RATE",
        help="a weight source and its read rate, e.g. 'NFS share=800MB/s' or 'hub=1Gb/s' (bits); "
        "repeat for several (default: the seed's hub 1 Gb/s, network volume 1 GB/s, local "
        "NVMe 3 GB/s, host page cache 10 GB/s)",
    )
    cold.add_argument(
        "--startup-s",
        type=_size_args.seconds,
        default=DEFAULT_STARTUP_S,
        metavar="S",
        help="container and process start, seconds (default: 20)",
    )
    cold.add_argument(
        "--warmup-s",
        type=_size_args.seconds,
        default=DEFAULT_WARMUP_S,
        metavar="S",
        help="engine warm-up (CUDA graphs, compilation), seconds (default: 40)",
    )
    cold.add_argument(
        "--arrival-rate",
        type=_size_args.seconds,
        metavar="R",
        help="requests per second arriving once traffic steps up: prints the backlog that "
        "piles up during each cold start",
    )
    cold.add_argument(
        "--served-rate",
        type=_size_args.seconds,
        default=0.0,
        metavar="R",
        help="requests per second the replicas already ready serve (default: 0, scaling from zero)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        reports = [_report(args, file) for file in args.files]
        sharing = _sharing(reports) if len(reports) > 1 else None
    except InvalidConfig as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return 1
    except (_SizeError, GpuError, ModelStatsError, ModelPathError) as exc:
        print(f"sie-worker size: {exc}", file=sys.stderr)
        return 1
    if args.json:
        if sharing is None:
            print(json.dumps(_size_report.to_json(reports[0]), indent=2))
        else:
            body = {
                "models": [_size_report.to_json(r) for r in reports],
                "sharing": _size_sharing.sharing_json(sharing),
            }
            print(json.dumps(body, indent=2))
    else:
        tables = [_size_report.to_table(r) for r in reports]
        if sharing is not None:
            tables.append(_size_sharing.sharing_table(sharing))
        print("\n\n".join(tables))
    return 0


def _sharing(reports: list[_size_report.Report]) -> Packing:
    """Which of the models share one GPU of the reports' GPU type."""
    settings = _worker_settings()
    tenants = []
    for report in reports:
        width = report.plan.width.width
        if width is not None:
            width = max(width, report.declared_width)
        loadtime = report.served.profile.loadtime
        engine = _engine_of(report.served, settings)
        key = family_of(engine).memory_option or "mem_fraction_static"
        fraction, memory_gib = loadtime.get(key), loadtime.get("memory_gib")
        tenants.append(
            Tenant(
                name=report.served.id,
                engine=engine,
                width=width,
                need_bytes=report.plan.total_bytes,
                weights_bytes=report.weights.bytes,
                declared_fraction=float(fraction) if isinstance(fraction, int | float) else None,
                declared_memory_gib=(
                    float(memory_gib) if isinstance(memory_gib, int | float) else None
                ),
            )
        )
    return pack(tenants, reports[0].gpu.memory_bytes, settings.memory_pressure_threshold_percent)


def _worker_settings() -> Settings:
    """The worker's settings that decide sharing: its bundle (the default adapter) and the
    pressure threshold (the budget)."""
    names = ("SIE_BUNDLE", "SIE_MEMORY_PRESSURE_THRESHOLD_PERCENT")
    try:
        return Settings.from_env({k: os.environ[k] for k in names if k in os.environ}, gpu=False)
    except SettingsError as exc:
        raise _SizeError(str(exc)) from None


def _engine_of(served: ServedModel, settings: Settings) -> EngineKind:
    """The engine serving the profile: its adapter's, else the bundle's default adapter's."""
    try:
        return adapter_of(served, settings).engine
    except (UnknownAdapter, NotServedHere):
        return PRODUCT_FAMILY.kind  # the load would refuse it; size it as SGLang would run it


def _report(args: argparse.Namespace, file: Path) -> _size_report.Report:
    config = load_config_file(file)
    try:
        served = served_model(config, args.profile)
    except KeyError as exc:
        raise InvalidConfig([Problem("$.profiles", str(exc.args[0]), str(file))]) from None
    gpu = gpu_from(args.gpu_type, args.gpu_memory)
    if gpu is None:
        raise _SizeError(
            f"name the GPU with --gpu-type (one of: {known_types()}) or --gpu-memory "
            f"(e.g. 80GB), or set {GPU_TYPE_ENV}"
        )
    hardware = hardware_for(gpu, args)
    cold = _size_report.ColdStartInputs(
        tuple(args.source or DEFAULT_SOURCES),
        args.startup_s,
        args.warmup_s,
        args.arrival_rate,
        args.served_rate,
    )
    stats = _family_stats(served, args.model_dir)
    path = stats.config_path if stats is not None else _config_json(served, args.model_dir)
    if path is None:
        return _weights_only(served, args, gpu, hardware, cold)
    stats = stats or read_model_stats(path)
    weights = resolve_weights(
        stats,
        params=args.params,
        bits=args.bits,
        compute_precision=served.profile.compute_precision,
    )
    kv_bytes, kv_source = kv_bytes_per_value(served)
    choice = workload_for(served, stats, context=args.context, sequences=args.sequences)
    lora = lora_for(
        served, path, layers=stats.shape.layers, base_bytes=weights.bytes, rank=args.lora_rank
    )
    # The engine's adapter buffers take GPU memory beside the weights: the KV cache never
    # gets it.
    model = ModelSize(stats.shape, weights.bytes + (lora.buffer_bytes if lora else 0), kv_bytes)
    moe = _size_args.moe_of(args.moe, stats.experts)
    return _size_report.Report(
        served=served,
        declared_width=declared_width(served),
        stats=stats,
        weights=weights,
        kv_bytes_per_value=kv_bytes,
        kv_source=kv_source,
        gpu=gpu,
        hardware=hardware,
        workload=choice,
        plan=plan(model, choice.workload, hardware, moe=moe[0]),
        warnings=warnings_for(
            served, stats, weights, hardware, context=choice.workload.context_tokens
        ),
        cold_start=cold,
        lora=lora,
        moe=moe,
    )


def _weights_only(
    served: ServedModel,
    args: argparse.Namespace,
    gpu: Gpu,
    hardware: Hardware,
    cold: _size_report.ColdStartInputs,
) -> _size_report.Report:
    if args.params is None:
        raise _SizeError(
            f"{served.config.hf_id}: no config.json in model_path or the Hugging Face cache; "
            "download it (e.g. `hf download "
            f"{served.config.hf_id} config.json model.safetensors.index.json`), pass "
            "--model-dir DIR, or pass --params (and --bits) for a weights-only plan"
        )
    bits, bits_source = (args.bits, "--bits") if args.bits else (16.0, "default (16-bit)")
    weights = Weights(args.params * bits / 8, "parameters x bits / 8", args.params, "--params",
                      bits, bits_source)  # fmt: skip
    moe = _size_args.moe_of(args.moe, None, config_json=False)
    return _size_report.Report(
        served=served,
        declared_width=declared_width(served),
        stats=None,
        weights=weights,
        kv_bytes_per_value=None,
        kv_source=None,
        gpu=gpu,
        hardware=hardware,
        workload=None,
        plan=plan_weights_only(weights.bytes, hardware, moe=moe[0]),
        warnings=[],
        cold_start=cold,
        moe=moe,
    )


def _family_stats(served: ServedModel, model_dir: Path | None) -> ModelStats | None:
    """The model's stats as its engine family reads its files (llama.cpp: a GGUF header),
    from ``--model-dir`` or its local folder; None: a config.json is read instead."""
    try:
        folder = model_dir or local_model_dir(served.config)
    except ModelPathError:
        return None
    family = family_of(_engine_of(served, _worker_settings()))
    return family.model_stats(folder, served.profile.loadtime) if folder is not None else None


def _config_json(served: ServedModel, model_dir: Path | None) -> Path | None:
    if model_dir is None:
        return find_config_json(served.config)
    path = model_dir if model_dir.name == "config.json" else model_dir / "config.json"
    if not path.is_file():
        raise _SizeError(f"--model-dir {model_dir}: no config.json there")
    return path
