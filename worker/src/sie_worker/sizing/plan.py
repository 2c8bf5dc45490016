"""Capacity arithmetic for ``sie-worker size``: model shape and numbers in, a plan out.

Pure functions, no I/O. Units: bytes throughout, "GB" in messages is 1e9 bytes (the
GPU data sheets' unit, see :mod:`sie_worker.sizing.gpus`).

The model:

- weights = parameters x bits per weight / 8;
- KV cache per token = 2 (K and V) x layers x KV heads x head_dim x bytes per value
  (a latent-attention model stores one latent vector per layer instead);
- total need = weights + KV per token x context x sequences;
- minimum GPUs = ceil(total need / (GPU memory x usable fraction));
- width = the smallest valid ``tensor_parallel_size`` >= that minimum that also holds the
  KV cache per GPU (valid: 1..8, divides the attention heads, a multiple or a divisor of
  the KV heads), powers of two preferred;
- KV budget of a replica = what the group has left after the weights; concurrency =
  budget / KV per sequence.

Weights per GPU are weights / width: tensor parallelism splits every large matrix, and
the pieces it copies to every rank (norms, biases) are small. KV heads are split while
there are at least as many as the width and copied when there are fewer, so a width above
the KV head count stores more KV per token than the formula above; :func:`plan` accounts
for it. Every layer is counted as full attention, so sliding-window models get an upper
bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from sie_worker.config.rules import MAX_WIDTH, valid_widths
from sie_worker.errors import Problem

__all__ = [
    "Hardware",
    "ModelSize",
    "Plan",
    "PoolSuggestion",
    "Shape",
    "WidthChoice",
    "Workload",
    "choose_width",
    "config_warnings",
    "is_power_of_two",
    "kv_bytes_per_token",
    "kv_bytes_per_token_per_gpu",
    "max_concurrency",
    "minimum_gpus",
    "plan",
    "plan_weights_only",
    "suggest_pool",
    "usable_bytes",
    "weights_bytes",
]

GB = 1e9
GIB = 2**30
# The example l4-4x pool's figures: 8Gi of /dev/shm and 16Gi/32Gi (request/limit) of memory
# per GPU.
_SHM_GIB_PER_GPU = 8
_MEMORY_REQUEST_GIB_PER_GPU = 16
_MEMORY_LIMIT_GIB_PER_GPU = 32
_EPS = 1e-9  # ceil() of a ratio that is an integer up to float rounding stays that integer


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


@dataclass(frozen=True)
class WidthChoice:
    width: int | None  # None: no width from 1 to 8 holds the model
    reason: str
    valid: tuple[int, ...]  # every width 1..8 the head counts allow


@dataclass(frozen=True)
class PoolSuggestion:
    """A starting point for a chart pool: measure the real use, then adjust."""

    gpu_count: int
    device_group: bool
    shm_size_gib: int
    memory_request_gib: int
    memory_limit_gib: int


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


def weights_bytes(params: float, bits_per_weight: float) -> float:
    return params * bits_per_weight / 8


def kv_bytes_per_token(shape: Shape, kv_bytes_per_value: float = 2.0) -> float:
    """KV cache bytes one token holds across all layers: 2 x layers x KV heads x head_dim x
    bytes per value, or layers x the latent width for latent attention."""
    if shape.kv_latent_dim is not None:
        return shape.layers * shape.kv_latent_dim * kv_bytes_per_value
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * kv_bytes_per_value


def kv_bytes_per_token_per_gpu(shape: Shape, width: int, kv_bytes_per_value: float = 2.0) -> float:
    """KV bytes per token on one GPU of a ``width`` group: heads split, copied when fewer."""
    whole = kv_bytes_per_token(shape, kv_bytes_per_value)
    if shape.kv_latent_dim is not None:
        return whole
    return whole / min(width, shape.kv_heads)


def usable_bytes(gpu_memory_bytes: float, usable: float) -> float:
    return gpu_memory_bytes * usable


def minimum_gpus(need_bytes: float, gpu_memory_bytes: float, usable: float) -> int:
    """GPUs to hold ``need_bytes`` at the usable fraction: ceil(need / usable per GPU), >= 1."""
    return max(1, math.ceil(need_bytes / usable_bytes(gpu_memory_bytes, usable) - _EPS))


def max_concurrency(kv_budget_bytes: float, kv_bytes_per_sequence: float) -> int:
    """Sequences of full context the budget holds at once: budget // KV bytes per sequence."""
    if kv_bytes_per_sequence <= 0:
        raise ValueError("kv_bytes_per_sequence must be above zero")
    return max(0, math.floor(kv_budget_bytes / kv_bytes_per_sequence + _EPS))


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def choose_width(
    min_gpus: int,
    shape: Shape,
    *,
    gpus_per_node: int = MAX_WIDTH,
    fits: tuple[int, ...] | None = None,
) -> WidthChoice:
    """The smallest valid width >= ``min_gpus``, a power of two when one qualifies.

    ``fits``, when given, narrows the candidates to widths that hold the KV cache too
    (a width above the KV head count copies heads and stores more per GPU).
    Powers of two are preferred because they divide a node of 2**k GPUs, so replicas of
    the group fill it with none left idle, and model head counts are mostly powers of two.
    """
    heads, kv = shape.attention_heads, shape.kv_heads
    valid = valid_widths(heads, kv)
    heads_text = f"{heads} attention heads and {kv} KV heads"
    if min_gpus > MAX_WIDTH:
        return WidthChoice(
            None,
            f"needs {min_gpus} GPUs, more than the {MAX_WIDTH} one engine can span "
            "(tensor_parallel_size 1..8): use fewer bits per weight (--bits), a shorter "
            "context, fewer sequences, or GPUs with more memory",
            valid,
        )
    candidates = [w for w in valid if w >= min_gpus and (fits is None or w in fits)]
    if not candidates:
        above = [w for w in valid if w >= min_gpus]
        why = (
            f"no valid width from {min_gpus} to {MAX_WIDTH} holds the KV cache "
            f"(widths above {kv} copy the KV heads)"
            if above
            else f"no width from {min_gpus} to {MAX_WIDTH} suits the {heads_text}"
        )
        return WidthChoice(
            None,
            f"{why} (valid widths: {', '.join(map(str, valid))}): use fewer bits per weight, "
            "a shorter context, fewer sequences, or GPUs with more memory",
            valid,
        )
    powers = [w for w in candidates if is_power_of_two(w)]
    width = powers[0] if powers else candidates[0]
    if width == 1:
        return WidthChoice(1, "fits one GPU: no split; add replicas for traffic", valid)
    parts = [f"needs {min_gpus} GPU{'s' if min_gpus > 1 else ''}"]
    if min_gpus not in candidates:
        parts.append(
            f"width {min_gpus} does not suit the {heads_text}"
            if min_gpus not in valid
            else f"width {min_gpus} cannot hold the copied KV heads"
        )
    if powers and candidates[0] != width:
        skipped = candidates[0]
        idle = gpus_per_node % skipped
        parts.append(
            f"{width} is a power of two, preferred over {skipped}: it divides a node of "
            f"{gpus_per_node} GPUs"
            + (f" (width {skipped} leaves {idle} idle)" if idle else "")
            + " and splits heads evenly"
        )
    elif powers:
        parts.append(f"{width} suits the {heads_text} and is a power of two")
    else:
        parts.append(
            f"no power of two from {min_gpus} to {MAX_WIDTH} suits the {heads_text}; "
            f"{width} is the smallest width that does"
        )
    return WidthChoice(width, "; ".join(parts), valid)


def suggest_pool(width: int, model_weights_bytes: float) -> PoolSuggestion:
    """Chart values for a pool that runs one replica per pod.

    Per GPU it starts from the l4-4x pool's figures (8Gi shm, 16Gi/32Gi memory); the limit
    also holds the whole checkpoint plus /dev/shm, since the ranks read their shards through
    host memory while loading and what the engine writes to /dev/shm counts against it.
    """
    shm = _SHM_GIB_PER_GPU * width
    limit = max(_MEMORY_LIMIT_GIB_PER_GPU * width, math.ceil(model_weights_bytes / GIB) + shm)
    request = max(_MEMORY_REQUEST_GIB_PER_GPU * width, math.ceil(limit / 2))
    return PoolSuggestion(
        gpu_count=width,
        device_group=width > 1,
        shm_size_gib=shm,
        memory_request_gib=request,
        memory_limit_gib=limit,
    )


def _fits(model: ModelSize, width: int, kv_tokens: float, per_gpu: float) -> bool:
    per_token = kv_bytes_per_token_per_gpu(model.shape, width, model.kv_bytes_per_value)
    return model.weights_bytes / width + kv_tokens * per_token <= per_gpu * (1 + _EPS)


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
        if _fits(model, w, kv_tokens, per_gpu)
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
        + _EPS
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
        fitting = [w for w in fitting if _fits(model, w, kv_tokens, per_gpu)]
        if not fitting:
            return "no width up to 8 does: use fewer bits per weight or GPUs with more memory"
        hint = f"width {fitting[0]} is the smallest that does"
        if devices is not None and fitting[0] > devices:
            hint += f" (this server has {devices} GPU{'s' if devices != 1 else ''})"
        return hint

    weights_per_gpu = model.weights_bytes / width
    if weights_per_gpu > per_gpu * (1 + _EPS):
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
    if kv_budget_tokens is not None and not _fits(model, width, budget, per_gpu):
        per_token = kv_bytes_per_token_per_gpu(shape, width, model.kv_bytes_per_value)
        room = math.floor((per_gpu - weights_per_gpu) / per_token + _EPS)
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
    if width > 1 and _fits(model, 1, one_gpu_tokens, per_gpu):
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
