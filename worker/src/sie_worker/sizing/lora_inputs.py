"""What ``sie-worker size`` reads to size a profile's LoRA adapters (:mod:`.lora`).

- the adapters: ``loadtime.lora_paths``; their rank and target modules from each local
  folder's ``adapter_config.json`` (``r``, ``target_modules``), the largest rank and the
  union of the modules; ``--lora-rank`` overrides the rank, and without either the rank is
  assumed to be 16 (said so in the report);
- the engine's buffers: ``max_loras_per_batch`` (SIE's default: 4 for generation) slots at
  ``--max-lora-rank`` from ``extra_launch_args``, else at the adapters' rank (SGLang infers
  it from them);
- the projections from the model's ``config.json``; values in the model's precision (2 bytes,
  4 with ``compute_precision: float32``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sie_worker.config.flags.option_tables import flag_value, option_tables
from sie_worker.config.load.hf_config import HFConfigError, read_hf_config
from sie_worker.config.lora import ADAPTER_CONFIG, lora_adapters, max_loras, resolve_local
from sie_worker.config.model import ServedModel
from sie_worker.sizing.lora import ALL_MODULES, LoraSizing, lora_sizing, projection_dims

__all__ = ["ASSUMED_RANK", "lora_for"]

ASSUMED_RANK = 16


def lora_for(
    served: ServedModel,
    config_json: Path,
    *,
    layers: int,
    base_bytes: float,
    rank: int | None = None,
) -> LoraSizing | None:
    """The adapter memory of the profile's adapters, or None when it declares none or
    ``config.json`` lacks the projection sizes."""
    loadtime = served.profile.loadtime
    adapters = lora_adapters(loadtime)
    if not adapters:
        return None
    try:
        dims = projection_dims(read_hf_config(config_json))
    except HFConfigError:
        dims = None
    if dims is None:
        return None
    ranks, modules = [], set()
    for lora in adapters:
        folder = resolve_local(lora.source, served.config.base_dir) if lora.local else None
        declared = _json(folder / ADAPTER_CONFIG) if folder is not None else None
        if declared is None:
            continue
        r = declared.get("r")
        if isinstance(r, int) and not isinstance(r, bool) and r > 0:
            ranks.append(r)
        targets = declared.get("target_modules")
        if isinstance(targets, list):
            modules |= {t for t in targets if isinstance(t, str)}
    if rank is not None:
        chosen = (rank, "--lora-rank")
    elif ranks:
        chosen = (max(ranks), "the adapters' adapter_config.json")
    else:
        chosen = (ASSUMED_RANK, f"assumed {ASSUMED_RANK}: pass --lora-rank")
    precision = loadtime.get("compute_precision", served.profile.compute_precision)
    return lora_sizing(
        adapters=len(adapters),
        dims=dims,
        layers=layers,
        base_bytes=base_bytes,
        rank=chosen,
        max_rank=_max_lora_rank(served.profile.extra_launch_args),
        slots=max_loras(loadtime, "generate"),
        modules=sorted(modules & set(ALL_MODULES), key=ALL_MODULES.index) or ALL_MODULES,
        bytes_per_value=4.0 if precision == "float32" else 2.0,
    )


def _max_lora_rank(args: tuple[str, ...]) -> tuple[int, str] | None:
    """``--max-lora-rank`` from extra_launch_args as SGLang reads it (any shipped release)."""
    for table in option_tables():
        raw = flag_value(args, {"max_lora_rank"}, table)
        if raw is not None and raw.isdigit() and int(raw) > 0:
            return int(raw), "--max-lora-rank in extra_launch_args"
    return None


def _json(path: Path) -> Mapping[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, Mapping) else None
