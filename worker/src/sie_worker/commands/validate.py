"""``sie-worker validate FILE... [--devices LIST]``: check model configs.

Prints one line per problem, ``FILE: <json-path>: <message>``, on stdout and exits 1; exits 0
when every config is valid. On stderr, one summary line per kind of file: valid; valid but
not (or only partly) served by this image, with the adapters; invalid. A folder stands for
the config files under it. Without ``--devices`` only the read-time rules run (schema, width
1..8, reserved flags, device-visibility variables, profiles, runtime options); with
``--devices`` every served model this image runs also gets the load-time rules for a worker
with those devices (and this environment's ``SIE_*`` settings). Exit 2 when the environment
itself is unusable.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from sie_worker.config.adapters import not_served_here
from sie_worker.config.files.reader import config_files, load_config_file
from sie_worker.config.load.loadtime import resolve_load_options
from sie_worker.config.model import ServedModel, served_models
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
    summary = _Summary()
    for file in files:
        try:
            config = load_config_file(file)
        except InvalidConfig as exc:
            problems += exc.problems
            summary.invalid.add(str(file))
            continue
        if config.sie_id in seen:
            message = f"{config.sie_id!r} is also declared in {seen[config.sie_id]}; keep one"
            problems.append(Problem("$.sie_id", message, str(file)))
            summary.invalid.add(str(file))
        seen.setdefault(config.sie_id, str(file))
        foreign = not_served_here(config)
        served = [s for s in served_models(config) if s.profile.name not in foreign]
        if settings is not None:
            found = _load_problems(served, settings)
            problems += found
            if found:
                summary.invalid.add(str(file))
        if str(file) not in summary.invalid:
            summary.add(str(file), foreign, len(config.profiles))
        if settings is not None and hardware is not None:
            warnings: dict[Problem, None] = {}
            for model in served:
                found_w = served_model_warnings(model, hardware, devices=len(settings.devices))
                warnings.update(dict.fromkeys(found_w))
            for warning in warnings:
                print(f"warning: {warning}", file=sys.stderr)
    for problem in problems:
        print(problem)
    for line in summary.lines():
        print(f"sie-worker validate: {line}", file=sys.stderr)
    return 1 if problems else 0


class _Summary:
    """Files by kind: valid, valid but not (or partly) served here, invalid."""

    def __init__(self) -> None:
        self.valid = 0
        self.partly: dict[str, int] = {}  # adapter -> profiles, in files some profiles serve
        self.partly_files = 0
        self.none: dict[str, int] = {}  # adapter -> files no profile of which is served here
        self.none_files = 0
        self.invalid: set[str] = set()

    def add(self, file: str, foreign: dict[str, str], profiles: int) -> None:
        if not foreign:
            self.valid += 1
            return
        if len(foreign) == profiles:
            self.none_files += 1
            for adapter in dict.fromkeys(foreign.values()):
                self.none[adapter] = self.none.get(adapter, 0) + 1
            return
        self.partly_files += 1
        for adapter in foreign.values():
            self.partly[adapter] = self.partly.get(adapter, 0) + 1

    def lines(self) -> list[str]:
        lines = []
        if self.valid or not (self.none_files or self.partly_files or self.invalid):
            lines.append(f"{self.valid} config file(s) valid")
        if self.none_files:
            lines.append(
                f"{self.none_files} config file(s) valid, not served by this image (adapter: "
                f"files): {_counts(self.none)}"
            )
        if self.partly_files:
            lines.append(
                f"{self.partly_files} config file(s) valid, some profiles not served by this "
                f"image (adapter: profiles): {_counts(self.partly)}"
            )
        if self.invalid:
            lines.append(f"{len(self.invalid)} config file(s) invalid")
        return lines


def _counts(counts: dict[str, int]) -> str:
    ordered = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return ", ".join(f"{adapter}: {count}" for adapter, count in ordered)


def _expand(paths: list[Path]) -> list[Path]:
    files: list[Path] = []
    for path in paths:
        files += config_files(path) if path.is_dir() else [path]
    return files


def _load_problems(served_models: list[ServedModel], settings: Settings) -> list[Problem]:
    problems: dict[Problem, None] = {}
    for served in served_models:
        try:
            resolve_load_options(served, settings)
        except InvalidConfig as exc:
            # Profiles inheriting one loadtime block repeat its problems: report each once.
            problems.update(dict.fromkeys(exc.problems))
    return list(problems)
