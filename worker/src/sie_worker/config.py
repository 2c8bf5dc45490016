"""Model configs: read, check against the schema and the read-time rules, resolve profiles.

Read-time rules (files at start, Config API writes, ``sie-worker validate``), for every
profile: ``tensor_parallel_size`` is an integer 1..8; ``extra_launch_args`` sets no
reserved SGLang flag (as SGLang's argparse would resolve it); ``extra_env`` sets no
device-visibility variable (any case, surrounding spaces); ``extends`` names an existing
profile without cycles; ``grammar_profile`` names an existing non-default profile;
``adapter_path`` names an adapter. Every problem is reported at once
(:class:`~sie_worker.errors.InvalidConfig`). Load-time rules live in :mod:`sie_worker.loadtime`.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from sie_worker.adapters import UnknownAdapter, resolve_adapter
from sie_worker.errors import InvalidConfig, Problem
from sie_worker.flags import reserved_flag_problems
from sie_worker.jsonpath import json_path
from sie_worker.schema import schema_problems, type_name
from sie_worker.yamldoc import load_document, plain_data

__all__ = [
    "CONFIG_SUFFIXES",
    "DEFAULT_PROFILE",
    "MAX_CONFIG_BYTES",
    "MAX_WIDTH",
    "VISIBILITY_VARIABLES",
    "ModelConfig",
    "Profile",
    "ServedModel",
    "config_files",
    "load_config_dir",
    "load_config_file",
    "parse_config",
    "parse_config_text",
    "served_model",
    "served_models",
    "width_problem",
]

DEFAULT_PROFILE = "default"
MAX_WIDTH = 8
MAX_CONFIG_BYTES = 1024 * 1024
CONFIG_SUFFIXES = (".yaml", ".yml", ".json")
MAX_ARG_BYTES = 128 * 1024  # Linux's MAX_ARG_STRLEN: one argv or environ string, with NUL
VISIBILITY_VARIABLES = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


@dataclass(frozen=True)
class Profile:
    name: str
    extends: str | None
    max_batch_tokens: int | None
    compute_precision: str | None
    kv_budget_tokens: int | None
    adapter_path: str | None  # None -> bundle default (see adapters.py)
    loadtime: Mapping[str, Any]  # after extends resolution
    runtime: Mapping[str, Any]
    extra_launch_args: tuple[str, ...]
    extra_env: Mapping[str, str]
    loadtime_from: str = DEFAULT_PROFILE  # the profile whose loadtime block this is (paths)


@dataclass(frozen=True)
class ModelConfig:
    sie_id: str
    hf_id: str
    revision: str | None
    model_path: str | None  # as written: local dir (relative to base_dir) or package:mod/sub
    tasks: Mapping[str, Mapping[str, Any]]
    profiles: Mapping[str, Profile]  # resolved (extends applied), "default" always present
    grammar_profile: str | None
    source: str | None  # file path or "<request>"
    raw: Mapping[str, Any]  # the document as read
    base_dir: Path | None = None  # where a relative model_path starts (the file's folder)


@dataclass(frozen=True)
class ServedModel:
    """One served model id: ``sie_id`` for the default profile, else ``<sie_id>:<profile>``."""

    id: str
    config: ModelConfig
    profile: Profile


def parse_config_text(
    text: str | bytes, *, source: str | None, base_dir: Path | None = None
) -> ModelConfig:
    """Parse YAML or JSON text and check it; raises :class:`InvalidConfig` with every problem."""
    data, problems = load_document(text)
    if problems:
        raise InvalidConfig(_with_file(problems, source))
    return parse_config(data, source=source, base_dir=base_dir)


def parse_config(data: object, *, source: str | None, base_dir: Path | None = None) -> ModelConfig:
    """Check parsed data (schema + read-time rules) and resolve its profiles."""
    doc, problems = plain_data(data)
    if not isinstance(doc, dict):
        got = type_name(doc)
        problems.append(
            Problem("$", f"must be a mapping with sie_id, hf_id, tasks and profiles, got {got}")
        )
        raise InvalidConfig(_with_file(problems, source))
    problems += schema_problems(doc)
    problems += _rule_problems(doc)
    if problems:
        raise InvalidConfig(_with_file(problems, source))
    return _build(doc, source=source, base_dir=base_dir)


def load_config_file(path: Path) -> ModelConfig:
    source = str(path)
    try:
        with path.open("rb") as handle:
            text = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise InvalidConfig(
            [Problem("$", f"cannot be read: {exc.strerror or exc}", source)]
        ) from None
    if len(text) > MAX_CONFIG_BYTES:
        message = f"is larger than {MAX_CONFIG_BYTES} bytes; a model config is a few lines"
        raise InvalidConfig([Problem("$", message, source)])
    return parse_config_text(text, source=source, base_dir=path.absolute().parent)


def config_files(path: Path) -> list[Path]:
    """Config files under ``path`` (recursive, sorted), skipping hidden names such as the
    ``..data`` folders of Kubernetes ConfigMap mounts; their top-level links are followed."""
    found: list[Path] = []
    for folder, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found += [
            Path(folder) / f
            for f in files
            if not f.startswith(".") and f.lower().endswith(CONFIG_SUFFIXES)
        ]
    return sorted(found)


def load_config_dir(path: Path) -> tuple[dict[str, ModelConfig], list[Problem]]:
    """Every valid config under ``path`` by sie_id, and the problems of the others.

    A second file declaring an sie_id already seen is refused; the first (by path) wins.
    """
    configs: dict[str, ModelConfig] = {}
    problems: list[Problem] = []
    for file in config_files(path):
        try:
            config = load_config_file(file)
        except InvalidConfig as exc:
            problems += exc.problems
            continue
        first = configs.get(config.sie_id)
        if first is not None:
            message = f"{config.sie_id!r} is also declared in {first.source}; keep one of the files"
            problems.append(Problem("$.sie_id", message, str(file)))
            continue
        configs[config.sie_id] = config
    return configs, problems


def served_models(config: ModelConfig) -> list[ServedModel]:
    """The default profile as ``sie_id``, then every other profile as ``<sie_id>:<profile>``."""
    return [served_model(config, name) for name in config.profiles]


def served_model(config: ModelConfig, profile: str) -> ServedModel:
    """The served model of one profile; KeyError names the profiles when it does not exist."""
    if profile not in config.profiles:
        raise KeyError(
            f"{config.sie_id} has no profile {profile!r}; profiles: " + ", ".join(config.profiles)
        )
    model_id = config.sie_id if profile == DEFAULT_PROFILE else f"{config.sie_id}:{profile}"
    return ServedModel(model_id, config, config.profiles[profile])


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


# --- read-time rules ---------------------------------------------------------------------


def _rule_problems(doc: Mapping[str, Any]) -> list[Problem]:
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


def _with_file(problems: list[Problem], source: str | None) -> list[Problem]:
    return [Problem(p.path, p.message, p.file or source) for p in problems]


# --- building the resolved config ----------------------------------------------------------


def _build(doc: Mapping[str, Any], *, source: str | None, base_dir: Path | None) -> ModelConfig:
    raw_profiles: Mapping[str, Mapping[str, Any]] = doc["profiles"]
    resolved: dict[str, Profile] = {}

    def build(name: str) -> Profile:
        if name not in resolved:
            raw = raw_profiles[name]
            parent = build(raw["extends"]) if "extends" in raw else None
            resolved[name] = _resolve_profile(name, raw, parent)
        return resolved[name]

    # Default first, then the others in the order written.
    for name in sorted(raw_profiles, key=lambda n: n != DEFAULT_PROFILE):
        build(name)
    ordered = {n: resolved[n] for n in sorted(resolved, key=lambda n: n != DEFAULT_PROFILE)}
    tasks = {k: MappingProxyType(dict(v)) for k, v in doc["tasks"].items()}
    return ModelConfig(
        sie_id=doc["sie_id"],
        hf_id=doc["hf_id"],
        revision=doc.get("revision"),
        model_path=doc.get("model_path"),
        tasks=MappingProxyType(tasks),
        profiles=MappingProxyType(ordered),
        grammar_profile=doc.get("grammar_profile"),
        source=source,
        raw=MappingProxyType(dict(doc)),
        base_dir=base_dir,
    )


def _resolve_profile(name: str, raw: Mapping[str, Any], parent: Profile | None) -> Profile:
    """Each field the profile sets replaces the parent's; loadtime, runtime and extra_env are
    inherited when absent or empty and replaced whole when nonempty."""
    options = raw.get("adapter_options", {})
    loadtime = options.get("loadtime") or {}
    runtime = options.get("runtime") or {}
    env = raw.get("extra_env") or {}

    def scalar(key: str) -> Any:
        if key in raw:
            return raw[key]
        return getattr(parent, key) if parent is not None else None

    inherit_loadtime = not loadtime and parent is not None
    return Profile(
        name=name,
        extends=raw.get("extends"),
        max_batch_tokens=scalar("max_batch_tokens"),
        compute_precision=scalar("compute_precision"),
        kv_budget_tokens=scalar("kv_budget_tokens"),
        adapter_path=scalar("adapter_path"),
        loadtime=parent.loadtime if inherit_loadtime and parent else MappingProxyType(loadtime),
        runtime=parent.runtime if not runtime and parent else MappingProxyType(runtime),
        extra_launch_args=(
            tuple(raw["extra_launch_args"])
            if "extra_launch_args" in raw
            else (parent.extra_launch_args if parent else ())
        ),
        extra_env=parent.extra_env if not env and parent else MappingProxyType(dict(env)),
        loadtime_from=parent.loadtime_from if inherit_loadtime and parent else name,
    )
