"""Run code with SIE's real client, sie-sdk, in its own Python 3.12 environment (.venv-sdk).

sie-sdk needs Python 3.12 and the tests run on 3.11, so its code runs in a subprocess of
``.venv-sdk/bin/python`` (made by ``scripts/setup``). The ``sie_sdk`` fixture gives a
:class:`SdkRunner`::

    def test_lists_models(sie_sdk, worker):
        models = sie_sdk.run("result = SIEClient(url).list_models()", url=worker.url)

The code runs with ``SIEClient``, ``SIEAsyncClient``, ``np`` (numpy), ``sie_sdk`` (the
module), ``error_of`` and the keyword inputs (JSON values) as globals; whatever it leaves in
``result`` comes back, numpy arrays as lists. ``error_of(fn, *args, **kwargs)`` calls ``fn``
and returns the exception it raised as ``{"type", "mro", "code", "status_code", ...}`` (None
when it raised nothing). Code that fails fails the test with its traceback. Without
.venv-sdk the fixture skips, except with ``CI=true``, where it fails.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.ci import missing
from tests.support.repo import ROOT

__all__ = ["SDK_PYTHON", "SdkRunner", "sie_sdk"]

SDK_PYTHON = ROOT / ".venv-sdk" / "bin" / "python"

# Runs inside .venv-sdk: reads {"code", "inputs"} on stdin, prints {"result"} as JSON.
_WRAPPER = r"""
import json, sys
import numpy as np
import sie_sdk
from sie_sdk import SIEAsyncClient, SIEClient

def error_of(fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except Exception as exc:
        info = {"type": type(exc).__name__, "mro": [c.__name__ for c in type(exc).__mro__],
                "message": str(exc)}
        for key in ("code", "status_code", "param", "retry_after", "error_class", "permanent",
                    "attempts"):
            if hasattr(exc, key):
                info[key] = getattr(exc, key)
        return info
    return None

def plain(value):
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, bytes):
        return value.hex()
    raise TypeError(type(value).__name__)

job = json.load(sys.stdin)
scope = {"SIEClient": SIEClient, "SIEAsyncClient": SIEAsyncClient, "np": np,
         "sie_sdk": sie_sdk, "error_of": error_of, **job["inputs"]}
exec(compile(job["code"], "<sie-sdk code>", "exec"), scope)
print(json.dumps({"result": scope.get("result")}, default=plain))
"""


@dataclass(frozen=True)
class SdkRunner:
    python: Path

    def run(self, code: str, *, timeout: float = 300.0, **inputs: Any) -> Any:
        """Run ``code`` with sie-sdk; returns what it left in ``result``."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SIE_", "PYTHON"))}
        done = subprocess.run(
            [str(self.python), "-c", _WRAPPER],
            input=json.dumps({"code": code, "inputs": inputs}),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            check=False,
        )
        if done.returncode != 0:
            raise AssertionError(f"sie-sdk code failed:\n{code}\n--- stderr:\n{done.stderr}")
        return json.loads(done.stdout.splitlines()[-1])["result"]


@pytest.fixture(scope="session")
def sie_sdk() -> SdkRunner:
    """The real sie-sdk 0.10.1, in .venv-sdk."""
    if not SDK_PYTHON.is_file():
        message = f"{SDK_PYTHON} is missing: scripts/setup makes it (it needs Python 3.12)"
        missing(message)
    return SdkRunner(SDK_PYTHON)
