"""``sie-worker validate FILE... [--devices LIST]``: check model configs.

Prints one line per problem, ``FILE: <json-path>: <message>``, on stdout and exits 1; exits 0
with a one-line summary on stderr when every config is valid. A folder stands for the config
files under it. Without ``--devices`` only the read-time rules run (schema, width 1..8,
reserved flags, device-visibility variables, profiles); with ``--devices`` every served
model also gets the load-time rules for a worker with those devices (and this environment's
``SIE_*`` settings). Exit 2 when the environment itself is unusable.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from sie_worker.config.loadtime import resolve_load_options
from sie_worker.config.model import ModelConfig, served_models
from sie_worker.config.reader import config_files, load_config_file
from sie_worker.errors import InvalidConfig, Problem
from sie_worker.settings import Settings, SettingsError
from sie_worker.sizing.capacity import add_gpu_arguments, hardware_from_args, served_model_warnings
from sie_worker.sizing.gpus import GpuError

__all__ = ["register", "run", "settings_for"]


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "validate",
        help="check model configs",
        description=__doc__.split("\n\n", 1)[1].replace("``", "") if __doc__ else None,
    )
    parser.add_argument("files", nargs="+", metavar="FILE", type=Path, help="config file or folder")
    parser.add_argument(
        "--devices",
        metavar="LIST",
        help="also apply the load-time rules for a worker with these devices (cuda:0,cuda:1)",
    )
    # With --devices: capacity warnings (stderr) when a GPU is named here or by $SIE_GPU_TYPE.
    add_gpu_arguments(parser, per_node=False)
    parser.set_defaults(func=run)


def settings_for(devices: str | None) -> Settings:
    """Settings from the environment, with ``devices`` replacing ``SIE_DEVICES`` when given."""
    env = dict(os.environ)
    if devices is not None:
        env["SIE_DEVICES"] = devices
    return Settings.from_env(env)


def run(args: argparse.Namespace) -> int:
    try:
        settings = settings_for(args.devices) if args.devices is not None else None
        hardware = hardware_from_args(args) if settings is not None else None
    except (SettingsError, GpuError) as exc:
        print(f"sie-worker validate: {exc}", file=sys.stderr)
        return 2
    problems: list[Problem] = []
    files = _expand(args.files)
    seen: dict[str, str] = {}
    for file in files:
        try:
            config = load_config_file(file)
        except InvalidConfig as exc:
            problems += exc.problems
            continue
        if config.sie_id in seen:
            message = f"{config.sie_id!r} is also declared in {seen[config.sie_id]}; keep one"
            problems.append(Problem("$.sie_id", message, str(file)))
        seen.setdefault(config.sie_id, str(file))
        if settings is not None:
            problems += _load_problems(config, settings)
        if settings is not None and hardware is not None:
            warnings: dict[Problem, None] = {}
            for served in served_models(config):
                found = served_model_warnings(served, hardware, devices=len(settings.devices))
                warnings.update(dict.fromkeys(found))
            for warning in warnings:
                print(f"warning: {warning}", file=sys.stderr)
    for problem in problems:
        print(problem)
    if problems:
        return 1
    print(f"sie-worker validate: {len(files)} config file(s) valid", file=sys.stderr)
    return 0


def _expand(paths: list[Path]) -> list[Path]:
    files: list[Path] = []
    for path in paths:
        files += config_files(path) if path.is_dir() else [path]
    return files


def _load_problems(config: ModelConfig, settings: Settings) -> list[Problem]:
    problems: dict[Problem, None] = {}
    for served in served_models(config):
        try:
            resolve_load_options(served, settings)
        except InvalidConfig as exc:
            # Profiles inheriting one loadtime block repeat its problems: report each once.
            problems.update(dict.fromkeys(exc.problems))
    return list(problems)
