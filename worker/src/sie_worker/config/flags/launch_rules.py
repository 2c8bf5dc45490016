"""Read-time rules for what a profile adds to the engine's command line and environment.

The same rules wherever the config writes them (profile level, or SIE's place under
``adapter_options.loadtime``): ``extra_launch_args`` sets no reserved engine flag (resolved
as the engine's own parser would, abbreviations and ``--flag=value`` included: the parser of
the family of the profile's adapter, else SGLang's) and holds no string Linux would refuse at
exec; ``extra_env`` sets no device-visibility variable (any letter case, surrounding spaces),
no variable a family's launcher writes (``VLLM_CPU_OMP_THREADS_BIND``, ...) or reads as its
flags (llama.cpp's ``LLAMA_ARG_*``), and no ``NAME=value`` Linux would refuse.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sie_server.adapters.base import EngineKind
from sie_worker.config.adapters import canonical_path
from sie_worker.config.files.jsonpath import json_path
from sie_worker.config.model import JsonPath
from sie_worker.engines.family import EngineFamily
from sie_worker.engines.registry import FAMILIES, PRODUCT_FAMILY, family_of, owned_variables
from sie_worker.errors import Problem

__all__ = [
    "BINDING_VARIABLES",
    "MAX_ARG_BYTES",
    "VISIBILITY_VARIABLES",
    "args_problems",
    "env_problems",
    "profile_engine",
]

MAX_ARG_BYTES = 128 * 1024  # Linux's MAX_ARG_STRLEN: one argv or environ string, with NUL
VISIBILITY_VARIABLES = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
# The engines' binding to their devices' cores, written by the launcher on cpu devices.
BINDING_VARIABLES = owned_variables()


def args_problems(
    args: Any, path: JsonPath, engine: EngineKind = PRODUCT_FAMILY.kind
) -> list[Problem]:
    """Problems of one ``extra_launch_args`` list written at ``path`` (shape errors are the
    schema's); reserved flags as ``engine`` reads them (a family without tables of its own,
    the default engine: as SGLang)."""
    if not (isinstance(args, list) and all(isinstance(a, str) for a in args)):
        return []
    problems = [
        Problem(json_path([*path, index]), message)
        for index, message in family_of(engine).launch_arg_problems(args)
    ]
    for index, arg in enumerate(args):
        size = len(arg.encode("utf-8", "surrogatepass")) + 1  # with its NUL
        if size > MAX_ARG_BYTES:
            problems.append(Problem(json_path([*path, index]), _too_long("argument", size)))
    return problems


def env_problems(env: Any, path: JsonPath) -> list[Problem]:
    """Problems of one ``extra_env`` mapping written at ``path``."""
    if not isinstance(env, Mapping):
        return []
    problems: list[Problem] = []
    for key, value in env.items():
        where = json_path([*path, key])
        if isinstance(value, str):
            size = len(f"{key}={value}".encode("utf-8", "surrogatepass")) + 1
            if size > MAX_ARG_BYTES:
                problems.append(Problem(where, _too_long("variable (NAME=value)", size)))
        variable = str(key).strip().upper()
        if variable in BINDING_VARIABLES:
            message = (
                f"{key!r} sets {variable}: the launcher writes it itself, one core list per "
                "rank, from the cores of the model's cpu devices; remove it (SIE_DEVICES "
                "cpu:0,cpu:1,... splits the container's cores between devices)"
            )
            problems.append(Problem(where, message))
        elif owner := _flag_reader(variable):
            message = (
                f"{key!r} sets {variable}, which {owner.label} reads as one of its flags: the "
                "worker sets its flags itself; pass the others in extra_launch_args, and remove it"
            )
            problems.append(Problem(where, message))
        elif variable in VISIBILITY_VARIABLES:
            message = (
                f"{key!r} sets the device-visibility variable {variable}: the launcher "
                "writes the device mask itself, after the profile's environment, from the "
                "model's GPU block; remove it (tensor_parallel_size sets how many GPUs)"
            )
            problems.append(Problem(where, message))
    return problems


def _flag_reader(variable: str) -> EngineFamily | None:
    """The family that reads ``variable`` as its flags (the launcher clears such variables)."""
    for family in FAMILIES.values():
        if family.owned_prefixes and variable.startswith(family.owned_prefixes):
            return family
    return None


def _too_long(what: str, size: int) -> str:
    return (
        f"is {size} bytes as an exec {what}; Linux refuses any single one over "
        f"{MAX_ARG_BYTES} bytes (MAX_ARG_STRLEN) when it starts the engine: shorten it, "
        "or pass the value through a file"
    )


def profile_engine(doc: Mapping[str, Any], name: str) -> EngineKind:
    """The engine whose flags a profile's extra_launch_args are read with at read time: vLLM's
    when the profile (or one it extends) names a vLLM adapter, else SGLang's (a profile
    without adapter_path runs the bundle's engine, known when it loads: the load checks the
    flags again against that engine's own release)."""
    profiles = doc.get("profiles")
    seen: set[str] = set()
    while isinstance(profiles, dict) and name not in seen:
        seen.add(name)
        profile = profiles.get(name)
        if not isinstance(profile, dict):
            break
        adapter = profile.get("adapter_path")
        if isinstance(adapter, str):
            path = canonical_path(adapter)
            owner = next((f for f in FAMILIES.values() if path in f.adapters), PRODUCT_FAMILY)
            return owner.kind
        parent = profile.get("extends")
        if not isinstance(parent, str):
            break
        name = parent
    return PRODUCT_FAMILY.kind
