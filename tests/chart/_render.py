"""Render chart/ with the pinned helm (`.tools/bin/helm`, else helm on PATH) for chart tests."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

__all__ = ["CHART", "EXAMPLES", "EXAMPLE_FILES", "REPO", "helm", "of_kind", "render"]

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "chart"
EXAMPLES = REPO / "values-examples"
EXAMPLE_FILES = sorted(EXAMPLES.glob("*.yaml"))


def _helm_binary() -> str:
    pinned = REPO / ".tools" / "bin" / "helm"
    if pinned.exists():
        return str(pinned)
    found = shutil.which("helm")
    if found is None:
        pytest.skip("helm is not installed (scripts/setup-tools puts it in .tools/bin)")
    return found


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run helm; with check, fail the test with helm's stderr when it exits non-zero."""
    done = subprocess.run(
        [_helm_binary(), *args], capture_output=True, text=True, timeout=120, check=False
    )
    if check and done.returncode != 0:
        pytest.fail(f"helm {' '.join(args)} failed:\n{done.stderr}", pytrace=False)
    return done


def render(
    *files: Path,
    sets: Sequence[str] = (),
    set_json: Sequence[str] = (),
    release: str = "sie",
    namespace: str = "sie",
) -> list[dict[str, Any]]:
    """The documents of `helm template` for ``release`` in ``namespace`` (both `sie`)."""
    args = ["template", release, str(CHART), "-n", namespace]
    for f in files:
        args += ["-f", str(f)]
    for s in sets:
        args += ["--set", s]
    for s in set_json:
        args += ["--set-json", s]
    return [d for d in yaml.safe_load_all(helm(*args).stdout) if d]


def of_kind(docs: Sequence[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d.get("kind") == kind]
