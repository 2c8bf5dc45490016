"""The repository's own scripts and Makefile, as tests reach them."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["ROOT", "load_script", "make_dry_run"]

ROOT = Path(__file__).resolve().parents[2]


def load_script(name: str) -> ModuleType:
    """Import ``scripts/<name>.py`` (not a package) as a module."""
    qualified = f"sie_scripts_{name}"
    spec = importlib.util.spec_from_file_location(qualified, ROOT / "scripts" / f"{name}.py")
    assert spec
    assert spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[qualified] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def make_dry_run(*args: str) -> str:
    """What ``make -n ARGS`` would run, from the repository root."""
    # Outside make's own environment, so that a `make test` running this prints no
    # "Entering directory" lines for the nested make.
    env = {k: v for k, v in os.environ.items() if k not in {"MAKEFLAGS", "MAKELEVEL", "MFLAGS"}}
    return subprocess.run(
        ["make", "--no-print-directory", "-n", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
