"""Problems a declared width or KV budget will meet on a GPU type: warnings, not refusals.
Pure."""

from __future__ import annotations

import math

from sie_worker.config.widths import MAX_WIDTH, model_width, valid_widths, width_fits
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
    stages: int = 1,
    kv_budget_tokens: int | None,
    context_tokens: int | None,
    hardware: Hardware,
    devices: int | None = None,
    profile: str = "default",
    loadtime_profile: str | None = None,
) -> list[Problem]:
    """Problems a declared width / KV budget will meet on ``hardware`` (warnings, not refusals).

    ``width`` is the tensor width, ``stages`` the pipeline stages (each GPU holds 1/stages of
    the layers). 1. ``tensor_parallel_size`` cannot hold the weights; 2. ``kv_budget_tokens``
    does not fit beside them; 3. the model fits one GPU but is split (more replicas of width 1 serve
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
    split = f"tensor_parallel_size {width}" + (
        f" x pipeline_parallel_size {stages}" if stages > 1 else ""
    )

    def _smallest(kv_tokens: float) -> str:
        tensor = valid_widths(shape.attention_heads, shape.kv_heads)
        fitting = [w for w in tensor if w > width]
        fitting = [w for w in fitting if fits_width(model, w, kv_tokens, per_gpu, pipeline=stages)]
        if fitting:
            hint = f"width {fitting[0]} is the smallest that does"
            split_width = model_width(fitting[0], stages)
        else:
            # No tensor width at these stages: the fewest GPUs of TP x PP, the wider TP first.
            splits = [
                (model_width(tp, pp), -tp, pp)
                for tp in tensor
                for pp in range(1, min(MAX_WIDTH, shape.layers) + 1)
                if model_width(tp, pp) > model_width(width, stages)
                and fits_width(model, tp, kv_tokens, per_gpu, pipeline=pp)
            ]
            if not splits:
                return (
                    f"no tensor width up to {MAX_WIDTH} x {MAX_WIDTH} pipeline stages does: use "
                    "fewer bits per weight or GPUs with more memory"
                )
            split_width, tp, pp = min(splits)
            hint = (
                f"no tensor width alone does; tensor_parallel_size {-tp} x "
                f"pipeline_parallel_size {pp} is the smallest split that does"
            )
        if devices is not None and not width_fits(split_width, devices):
            hint += f" (this server has {devices} GPU{'s' if devices != 1 else ''})"
        return hint

    weights_per_gpu = model.weights_bytes / (width * stages)
    if weights_per_gpu > per_gpu * (1 + EPS):
        return [
            Problem(
                tp_path,
                f"{split} cannot hold the weights: "
                f"{_gb(weights_per_gpu)} per GPU, {gpu_text}; "
                + (
                    f"with kv_budget_tokens {kv_budget_tokens}, {_smallest(budget)}"
                    if kv_budget_tokens
                    else _smallest(0)
                ),
            )
        ]
    problems: list[Problem] = []
    if kv_budget_tokens is not None and not fits_width(
        model, width, budget, per_gpu, pipeline=stages
    ):
        per_token = kv_bytes_per_token_per_gpu(
            shape, width, model.kv_bytes_per_value, pipeline=stages
        )
        room = math.floor((per_gpu - weights_per_gpu) / per_token + EPS)
        problems.append(
            Problem(
                f"{base}.kv_budget_tokens",
                f"kv_budget_tokens {kv_budget_tokens} does not fit beside the weights at "
                f"{'width ' + str(width) if stages == 1 else split}: "
                f"{_gb(budget * per_token)} of KV cache per GPU after "
                f"{_gb(weights_per_gpu)} of weights, {gpu_text}; about {room:,} tokens fit; "
                f"{_smallest(budget)}",
            )
        )
    one_gpu_tokens = kv_budget_tokens if kv_budget_tokens is not None else context_tokens or 0
    if width * stages > 1 and fits_width(model, 1, one_gpu_tokens, per_gpu):
        need = model.weights_bytes + one_gpu_tokens * kv_bytes_per_token(
            shape, model.kv_bytes_per_value
        )
        problems.append(
            Problem(
                tp_path,
                f"the model fits one GPU ({_gb(need)} of weights and KV cache, {gpu_text}) "
                f"but {'tensor_parallel_size is ' + str(width) if stages == 1 else split}: "
                "split only a model that does not fit "
                "one GPU; run one replica per GPU instead (a pool without gpu.deviceGroup)",
            )
        )
    return sorted(problems)
