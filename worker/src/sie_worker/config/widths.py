"""A model's width, the number of devices its engine spans: the one home of the rules on it.

A tensor width (``tensor_parallel_size``) and a pipeline depth (``pipeline_parallel_size``)
are integers 1..8; the model's width is their product (:func:`model_width`). A width fits a
worker or a slot when it is at most its device count (seed 000), and tensor parallelism must
split the model's attention heads and meet its KV heads (the tensor width alone: pipeline
stages split layers). A model wider than one worker is served by a group of N nodes, width / N
devices on each (:func:`group_width_problem`). The worker's load-time check and placement,
``size``, and the router's and gateway's choice of a slot or pool all import these; none
compares a width itself.
"""

from __future__ import annotations

from sie_worker.config.files.json_types import type_name

__all__ = [
    "MAX_WIDTH",
    "group_width_problem",
    "model_width",
    "rank_width",
    "stages_problem",
    "valid_widths",
    "width_fits",
    "width_fits_heads",
    "width_problem",
    "width_words",
]

MAX_WIDTH = 8  # of the tensor width, and of the pipeline depth


def model_width(tensor: int, stages: int) -> int:
    """The devices a model claims in all: tensor width x pipeline stages."""
    return tensor * stages


def width_words(width: int, stages: int) -> str:
    """How a refusal names a model's width: the tensor width alone, or both factors."""
    if stages == 1:
        return f"tensor_parallel_size {width}"
    return (
        f"width {width}: tensor_parallel_size {width // stages} x pipeline_parallel_size {stages}"
    )


def rank_width(width: int, nodes: int) -> int:
    """The devices each rank of a group of ``nodes`` claims (spread equally)."""
    return width // nodes


def group_width_problem(width: int, devices: int, nodes: int) -> str | None:
    """Why a model of ``width`` cannot be served by ``nodes`` workers of ``devices`` devices
    each (``nodes`` 1: one worker), or None when it can. A width that fits one worker is
    served by it alone; a wider one by the whole group, width / nodes devices on every rank."""
    if width_fits(width, devices):
        return None
    fix = (
        "lower tensor_parallel_size x pipeline_parallel_size, or serve the model from a pool "
        "with gpu.deviceGroup: true and more GPUs per node (gpu.count)"
    )
    if nodes < 2:
        return (
            f"needs {width} devices but this worker has {devices}, and it is no group of "
            f"nodes (SIE_NODES is unset): {fix}, or from a group of nodes (gpu.nodes)"
        )
    if width % nodes:
        return (
            f"needs {width} devices, which SIE_NODES={nodes} nodes cannot share equally "
            f"(each rank claims width / {nodes}): make the width a multiple of {nodes}"
        )
    if width > devices * nodes:
        return (
            f"needs {width} devices but the group has {nodes} nodes x {devices} devices = "
            f"{devices * nodes}: {fix}, or more nodes (gpu.nodes)"
        )
    return None


def stages_problem(value: object) -> str | None:
    """Why ``value`` is not a pipeline depth (an integer 1..8), or None when it is one."""
    return _count_problem(value, "write the number of pipeline stages, e.g. 2", "stage")


def width_fits(width: int, devices: int) -> bool:
    """Whether a model of ``width`` fits a worker (or a slot) of ``devices`` devices: the one
    home of the rule (seed 000: width <= device count), for the worker's load-time check and
    placement, and the router's and gateway's choice of a slot or pool."""
    return 1 <= width <= devices


def width_problem(value: object) -> str | None:
    """Why ``value`` is not a width (an integer 1..8), or None when it is one."""
    return _count_problem(value, "write the number of GPUs, e.g. 2", "GPU")


def _count_problem(value: object, example: str, unit: str) -> str | None:
    expected = f"must be an integer from 1 to {MAX_WIDTH}"
    if isinstance(value, bool) or value is None:
        shown = "null" if value is None else str(value).lower()
        return f"{expected}, got {shown}; {example}"
    if isinstance(value, float):
        return f"{expected}, got {value!r} (a number with a decimal point); write a whole number"
    if isinstance(value, str):
        return f"{expected}, got the string {value!r}; write the number without quotes"
    if not isinstance(value, int):
        return f"{expected}, got {type_name(value)}"
    if value < 1:
        return f"{expected}, got {value}; a model needs at least one {unit}"
    if value > MAX_WIDTH:
        shown = str(value) if value < 10**12 else "a larger number"
        limit = (
            f"at most {MAX_WIDTH} {unit}s per model"
            if unit == "stage"
            else (f"places one model on at most {MAX_WIDTH} GPUs")
        )
        return f"{expected}, got {shown}; SIE " + ("allows " if unit == "stage" else "") + limit
    return None


def width_fits_heads(width: int, attention_heads: int, kv_heads: int) -> bool:
    """Whether tensor parallelism of ``width`` can split these heads: 1..8 GPUs, dividing the
    attention heads, and a multiple or a divisor of the KV heads (KV heads are copied when
    fewer than the width)."""
    return (
        1 <= width <= MAX_WIDTH
        and attention_heads % width == 0
        and (kv_heads % width == 0 or width % kv_heads == 0)
    )


def valid_widths(attention_heads: int, kv_heads: int) -> tuple[int, ...]:
    return tuple(
        w for w in range(1, MAX_WIDTH + 1) if width_fits_heads(w, attention_heads, kv_heads)
    )
