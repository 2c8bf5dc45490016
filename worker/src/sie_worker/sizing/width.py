"""The width to declare: the smallest valid ``tensor_parallel_size`` that holds the model,
powers of two preferred. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from sie_worker.config.widths import MAX_WIDTH, valid_widths
from sie_worker.sizing.arithmetic import Shape, is_power_of_two

__all__ = ["WidthChoice", "choose_width"]


@dataclass(frozen=True)
class WidthChoice:
    width: int | None  # None: no width from 1 to 8 holds the model
    reason: str
    valid: tuple[int, ...]  # every width 1..8 the head counts allow


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
