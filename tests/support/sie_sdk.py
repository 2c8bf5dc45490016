"""The real SIE client (``sie-sdk``, Python 3.12) for tests that talk to our servers as SIE
users do, run as a subprocess of its own interpreter.

``sie_sdk_python`` finds an interpreter that imports ``sie_sdk``: ``SIE_SDK_PYTHON`` when
set, else the first of :data:`CANDIDATES` (where the setup script installs the pinned,
hash-locked client). Without one the test is skipped on a developer machine and fails in
CI (``CI=true``), where the client must be installed.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

__all__ = ["CANDIDATES", "find_sie_sdk_python", "run_sdk", "sie_sdk_python"]

_REPO = Path(__file__).resolve().parents[2]
CANDIDATES = (
    _REPO / ".venv-sie-sdk" / "bin" / "python",
    _REPO / ".tools" / "sie-sdk" / "bin" / "python",
)


def find_sie_sdk_python() -> Path | None:
    explicit = os.environ.get("SIE_SDK_PYTHON", "").strip()
    candidates = [Path(explicit)] if explicit else list(CANDIDATES)
    for python in candidates:
        if not python.is_file():
            continue
        probe = subprocess.run(
            [str(python), "-c", "import sie_sdk"], capture_output=True, timeout=60, check=False
        )
        if probe.returncode == 0:
            return python
    return None


@pytest.fixture(scope="session")
def sie_sdk_python() -> Path:
    python = find_sie_sdk_python()
    if python is None:
        where = os.environ.get("SIE_SDK_PYTHON") or ", ".join(str(c) for c in CANDIDATES)
        message = f"no Python with sie-sdk at {where}; run scripts/setup or set SIE_SDK_PYTHON"
        if os.environ.get("CI") == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return python


def run_sdk(python: Path, script: str, args: Sequence[str] = (), timeout: float = 120) -> Any:
    """Run ``script`` (Python source using sie_sdk) with ``args`` as ``sys.argv[1:]``; it
    prints one JSON document, which is returned. Fails with its stderr otherwise."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SIE_", "PYTHON"))}
    result = subprocess.run(
        [str(python), "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )
    assert result.returncode == 0, f"sie-sdk script failed:\n{result.stderr[-4000:]}"
    return json.loads(result.stdout)
