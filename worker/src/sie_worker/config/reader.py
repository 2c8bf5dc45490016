"""Model configs: read YAML or JSON, check it against the schema and the read-time rules
(:mod:`sie_worker.config.rules`), and resolve its profiles. Every problem is reported at once
(:class:`~sie_worker.errors.InvalidConfig`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from sie_worker.config.model import DEFAULT_PROFILE, ModelConfig, Profile
from sie_worker.config.rules import rule_problems
from sie_worker.config.schema import schema_problems, type_name
from sie_worker.config.yamldoc import load_document, plain_data
from sie_worker.errors import InvalidConfig, Problem

__all__ = [
    "CONFIG_SUFFIXES",
    "MAX_CONFIG_BYTES",
    "config_files",
    "load_config_dir",
    "load_config_file",
    "parse_config",
    "parse_config_text",
]

MAX_CONFIG_BYTES = 1024 * 1024
CONFIG_SUFFIXES = (".yaml", ".yml", ".json")


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
    problems += rule_problems(doc)
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
