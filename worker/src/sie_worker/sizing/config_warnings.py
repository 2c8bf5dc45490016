"""Problems a declared width or KV budget will meet on a GPU type: warnings, not refusals.
Pure."""

from __future__ import annotations

import math

from sie_worker.config.widths import valid_widths
from sie_worker.errors import Problem
from sie_worker.sizing.arithmetic import (
    EPS,
    GB,
    Hardware,
    ModelSize,
    fits_width,
    kv_bytes_per_token,
    kv_bytes_per_token_per_gpu,
    usable_bytes,
)

__all__ = ["config_warnings"]


def _gb(n: float) -> str:
    return f"{n / GB:.1f} GB"


def config_warnings(
    model: ModelSize,
    *,
    width: int,
    kv_budget_tokens: int | None,
    context_tokens: int | None,
    hardware: Hardware,
    devices: int | None = None,
    profile: str = "default",
    loadtime_profile: str | None = None,
) -> list[Problem]:
    """Problems a declared width / KV budget will meet on ``hardware`` (warnings, not refusals).

    1. ``tensor_parallel_size`` cannot hold the weights; 2. ``kv_budget_tokens`` does not
    fit beside them; 3. the model fits one GPU but is split (more replicas of width 1 serve
    more than one split replica).
    ``devices``, when known, is how many GPUs the server has; messages mention it when
    the width they call for is larger. Paths name ``profile``; the width's names
    ``loadtime_profile``, the profile whose loadtime block ``profile`` inherits, when given.
    """
    base = f"$.profiles.{profile}"
    tp_path = (
        f"$.profiles.{loadtime_profile or profile}.adapter_options.loadtime.tensor_parallel_size"
    )
    per_gpu = usable_bytes(hardware.gpu_memory_bytes, hardware.usable)
    gpu_text = (
        f"{_gb(per_gpu)} usable of each {_gb(hardware.gpu_memory_bytes)} GPU at {hardware.usable:g}"
    )
    shape = model.shape
    budget = kv_budget_tokens or 0

    def _smallest(kv_tokens: float) -> str:
        fitting = [w for w in valid_widths(shape.attention_heads, shape.kv_heads) if w > width]
        fitting = [w for w in fitting if fits_width(model, w, kv_tokens, per_gpu)]
        if not fitting:
            return "no width up to 8 does: use fewer bits per weight or GPUs with more memory"
        hint = f"width {fitting[0]} is the smallest that does"
        if devices is not None and fitting[0] > devices:
            hint += f" (this server has {devices} GPU{'s' if devices != 1 else ''})"
        return hint

    weights_per_gpu = model.weights_bytes / width
    if weights_per_gpu > per_gpu * (1 + EPS):
        return [
            Problem(
                tp_path,
                f"tensor_parallel_size {width} cannot hold the weights: "
                f"{_gb(weights_per_gpu)} per GPU, {gpu_text}; "
                + (
                    f"with kv_budget_tokens {kv_budget_tokens}, {_smallest(budget)}"
                    if kv_budget_tokens
                    else _smallest(0)
                ),
            )
        ]
    problems: list[Problem] = []
    if kv_budget_tokens is not None and not fits_width(model, width, budget, per_gpu):
        per_token = kv_bytes_per_token_per_gpu(shape, width, model.kv_bytes_per_value)
        room = math.floor((per_gpu - weights_per_gpu) / per_token + EPS)
        problems.append(
            Problem(
                f"{base}.kv_budget_tokens",
                f"kv_budget_tokens {kv_budget_tokens} does not fit beside the weights at "
                f"width {width}: {_gb(budget * per_token)} of KV cache per GPU after "
                f"{_gb(weights_per_gpu)} of weights, {gpu_text}; about {room:,} tokens fit; "
                f"{_smallest(budget)}",
            )
        )
    one_gpu_tokens = kv_budget_tokens if kv_budget_tokens is not None else context_tokens or 0
    if width > 1 and fits_width(model, 1, one_gpu_tokens, per_gpu):
        need = model.weights_bytes + one_gpu_tokens * kv_bytes_per_token(
            shape, model.kv_bytes_per_value
        )
        problems.append(
            Problem(
                tp_path,
                f"the model fits one GPU ({_gb(need)} of weights and KV cache, {gpu_text}) "
                f"but tensor_parallel_size is {width}: split only a model that does not fit "
                "one GPU; run one replica per GPU instead (a pool without gpu.deviceGroup)",
            )
        )
    return sorted(problems)
