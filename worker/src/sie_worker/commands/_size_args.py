"""``sie-worker size``'s argument values: parameter counts, bits, weight sources, seconds, and
whether the model is a mixture of experts (``--moe`` / ``--no-moe`` over its config.json)."""

from __future__ import annotations

import argparse
import re

from sie_worker.sizing.cold_start import WeightSource, parse_source

__all__ = ["bits", "moe_of", "params", "seconds", "source"]

_PARAMS = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)\s*([kKmMbBtT]?)\s*$")
_PARAM_UNITS = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}


def params(text: str) -> float:
    match = _PARAMS.match(text)
    value = float(match.group(1)) * _PARAM_UNITS[match.group(2).lower()] if match else 0.0
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r}: a parameter count such as 70.6B, 405B, 500M or 8e9"
        )
    return value


def bits(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value <= 32:
        raise argparse.ArgumentTypeError(f"{text!r}: bits per weight above 0, at most 32, e.g. 16")
    return value


def source(text: str) -> WeightSource:
    try:
        return parse_source(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: a number of at least 0, e.g. 20")
    return value


def moe_of(flag: bool | None, experts: int | None, *, config_json: bool = True) -> tuple[bool, str]:
    """(mixture of experts?, why): ``--moe`` / ``--no-moe`` when given, else config.json's
    routed experts (more than one), else dense."""
    if flag is not None:
        return flag, "--moe" if flag else "--no-moe"
    if not config_json:
        return False, "no config.json: dense unless --moe"
    if experts is not None and experts > 1:
        return True, f"config.json: {experts} routed experts"
    return False, "config.json: no routed experts" if experts is None else "config.json: one expert"
