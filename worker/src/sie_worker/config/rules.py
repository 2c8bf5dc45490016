"""Read-time rules: what a config must satisfy beyond its schema, checked whenever a config
is read (files at start, Config API writes, ``sie-worker validate``).

For every profile: ``tensor_parallel_size`` is an integer 1..8; ``extra_launch_args`` sets no
reserved SGLang flag (as SGLang's argparse would resolve it) and holds no string Linux would
refuse at exec; ``extra_env`` sets no device-visibility variable (any case, surrounding
spaces); ``extends`` names an existing profile without cycles; ``grammar_profile`` names an
existing non-default profile; ``adapter_path`` names an adapter. Load-time rules live in
:mod:`sie_worker.config.loadtime`.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from sie_worker.config.adapters import UnknownAdapter, resolve_adapter
from sie_worker.config.jsonpath import json_path
from sie_worker.config.model import DEFAULT_PROFILE
from sie_worker.config.reserved_flags import reserved_flag_problems
from sie_worker.config.schema import type_name
from sie_worker.errors import Problem

__all__ = [
    "MAX_ARG_BYTES",
    "MAX_WIDTH",
    "VISIBILITY_VARIABLES",
    "rule_problems",
    "valid_widths",
    "width_fits_heads",
    "width_problem",
]

MAX_WIDTH = 8
MAX_ARG_BYTES = 128 * 1024  # Linux's MAX_ARG_STRLEN: one argv or environ string, with NUL
VISIBILITY_VARIABLES = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


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


def rule_problems(doc: Mapping[str, Any]) -> list[Problem]:
    problems: list[Problem] = []
    profiles = doc.get("profiles")
    if not isinstance(profiles, dict):
        return problems
    names = [n for n in profiles if isinstance(profiles[n], dict)]
    for name in names:
        problems += _profile_problems(name, profiles[name], names)
    problems += _cycle_problems({n: profiles[n] for n in names})
    grammar = doc.get("grammar_profile")
    if isinstance(grammar, str):
        path = "$.grammar_profile"
        if grammar == DEFAULT_PROFILE:
            message = "must name a non-default profile (grammar requests are routed to it)"
            problems.append(Problem(path, message + "; add one and name it here"))
        elif grammar not in profiles:
            problems.append(Problem(path, _no_profile(grammar, names)))
    return problems


def _profile_problems(name: str, profile: Mapping[str, Any], names: list[str]) -> list[Problem]:
    problems: list[Problem] = []
    base = ["profiles", name]
    options = profile.get("adapter_options")
    loadtime = options.get("loadtime") if isinstance(options, dict) else None
    if isinstance(loadtime, dict) and "tensor_parallel_size" in loadtime:
        message = width_problem(loadtime["tensor_parallel_size"])
        if message is not None:
            path = [*base, "adapter_options", "loadtime", "tensor_parallel_size"]
            problems.append(Problem(json_path(path), message))
    args = profile.get("extra_launch_args")
    if isinstance(args, list) and all(isinstance(a, str) for a in args):
        for index, message in reserved_flag_problems(args):
            problems.append(Problem(json_path([*base, "extra_launch_args", index]), message))
        for index, arg in enumerate(args):
            size = len(arg.encode("utf-8", "surrogatepass")) + 1  # with its NUL
            if size > MAX_ARG_BYTES:
                message = _too_long("argument", size)
                problems.append(Problem(json_path([*base, "extra_launch_args", index]), message))
    env = profile.get("extra_env")
    if isinstance(env, dict):
        for key, value in env.items():
            if isinstance(value, str):
                size = len(f"{key}={value}".encode("utf-8", "surrogatepass")) + 1
                if size > MAX_ARG_BYTES:
                    message = _too_long("variable (NAME=value)", size)
                    problems.append(Problem(json_path([*base, "extra_env", key]), message))
            variable = key.strip().upper()
            if variable in VISIBILITY_VARIABLES:
                message = (
                    f"{key!r} sets the device-visibility variable {variable}: the launcher "
                    "writes the device mask itself, after the profile's environment, from the "
                    "model's GPU block; remove it (tensor_parallel_size sets how many GPUs)"
                )
                problems.append(Problem(json_path([*base, "extra_env", key]), message))
    extends = profile.get("extends")
    if isinstance(extends, str) and extends not in names:
        problems.append(Problem(json_path([*base, "extends"]), _no_profile(extends, names)))
    adapter = profile.get("adapter_path")
    if isinstance(adapter, str):
        try:
            resolve_adapter(adapter)
        except UnknownAdapter as exc:
            problems.append(Problem(json_path([*base, "adapter_path"]), str(exc)))
    return problems


def _too_long(what: str, size: int) -> str:
    return (
        f"is {size} bytes as an exec {what}; Linux refuses any single one over "
        f"{MAX_ARG_BYTES} bytes (MAX_ARG_STRLEN) when it starts the engine: shorten it, "
        "or pass the value through a file"
    )


def _cycle_problems(profiles: Mapping[str, Mapping[str, Any]]) -> list[Problem]:
    problems: list[Problem] = []
    reported: set[str] = set()
    for start in profiles:
        chain = [start]
        current = profiles[start].get("extends")
        while isinstance(current, str) and current in profiles:
            if current in chain:
                cycle = [*chain[chain.index(current) :], current]
                if not reported.intersection(cycle):
                    reported.update(cycle)
                    message = (
                        f"profiles extend each other in a cycle ({' -> '.join(cycle)}); "
                        "remove one of these extends"
                    )
                    problems.append(Problem(json_path(["profiles", current, "extends"]), message))
                break
            chain.append(current)
            current = profiles[current].get("extends")
    return problems


def _no_profile(name: str, names: list[str]) -> str:
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]}?" if close else "profiles: " + ", ".join(names)
    return f"names no profile of this config ({name!r}); {hint}"
