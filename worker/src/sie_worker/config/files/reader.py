"""Model configs: read YAML or JSON, check it against the schema and the read-time rules
(:mod:`sie_worker.config.rules`), and build the normalised config with its profiles resolved
(:mod:`sie_worker.config.files.normalize`). Every problem is reported at once
(:class:`~sie_worker.errors.InvalidConfig`). Reading never changes a file.
"""

from __future__ import annotations

import os
from pathlib import Path

from sie_worker.config.files.json_types import type_name
from sie_worker.config.files.normalize import build_config
from sie_worker.config.files.schema import schema_problems
from sie_worker.config.files.yamldoc import load_document, plain_data
from sie_worker.config.model import ModelConfig
from sie_worker.config.rules import rule_problems
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
    return build_config(doc, source=source, base_dir=base_dir)


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
