"""A model's width, the number of devices its engine spans: the one home of the rules on it.

A width is an integer 1..8; it fits a worker or a slot when it is at most its device count
(seed 000), and tensor parallelism of that width must split the model's attention heads and
meet its KV heads. The worker's load-time check and placement, ``size``, and the router's
and gateway's choice of a slot or pool all import these; none compares a width itself.
"""

from __future__ import annotations

from sie_worker.config.files.json_types import type_name

__all__ = ["MAX_WIDTH", "valid_widths", "width_fits", "width_fits_heads", "width_problem"]

MAX_WIDTH = 8


def width_fits(width: int, devices: int) -> bool:
    """Whether a model of ``width`` fits a worker (or a slot) of ``devices`` devices: the one
    home of the rule (seed 000: width <= device count), for the worker's load-time check and
    placement, and the router's and gateway's choice of a slot or pool."""
    return 1 <= width <= devices


def width_problem(value: object) -> str | None:
    """Why ``value`` is not a width (an integer 1..8), or None when it is one."""
    expected = f"must be an integer from 1 to {MAX_WIDTH}"
    if isinstance(value, bool) or value is None:
        shown = "null" if value is None else str(value).lower()
        return f"{expected}, got {shown}; write the number of GPUs, e.g. 2"
    if isinstance(value, float):
        return f"{expected}, got {value!r} (a number with a decimal point); write a whole number"
    if isinstance(value, str):
        return f"{expected}, got the string {value!r}; write the number without quotes"
    if not isinstance(value, int):
        return f"{expected}, got {type_name(value)}"
    if value < 1:
        return f"{expected}, got {value}; a model needs at least one GPU"
    if value > MAX_WIDTH:
        shown = str(value) if value < 10**12 else "a larger number"
        return f"{expected}, got {shown}; SIE places one model on at most {MAX_WIDTH} GPUs"
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
