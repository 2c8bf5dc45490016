"""SGLang's own argument parser for the tests: ``parse(request, python_path)`` answers what
``tests/support/sglang_parser_harness.py`` answers for ``request``, from one harness process
per release (``python_path``: the folder holding that release, else the venv's) kept for the
whole pytest process. Importing SGLang costs seconds of CPU a start; four test modules ask
its parser, each once or twice, so a pytest process imports each release once."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO, Any

from tests.support.repo import ROOT

__all__ = ["HARNESS", "parse"]

HARNESS = ROOT / "tests" / "support" / "sglang_parser_harness.py"

_harnesses: dict[str, tuple[subprocess.Popen[str], IO[str]]] = {}


def parse(request: dict[str, Any], python_path: Path | None = None) -> dict[str, Any]:
    """The harness's answer to ``request`` (argvs, tokens, server_args, table_script)."""
    process, log = _harness(python_path)
    assert process.stdin is not None
    assert process.stdout is not None
    process.stdin.write(json.dumps(request) + "\n")
    process.stdin.flush()
    line = process.stdout.readline()
    if not line:  # it died: its stderr says why
        log.seek(0)
        why = log.read()[-3000:]
        _discard(str(python_path or ""))
        raise AssertionError(f"the SGLang parser harness exited:\n{why}")
    answer: dict[str, Any] = json.loads(line)
    return answer


def _harness(python_path: Path | None) -> tuple[subprocess.Popen[str], IO[str]]:
    key = str(python_path or "")
    if key in _harnesses and _harnesses[key][0].poll() is None:
        return _harnesses[key]
    _discard(key)  # one that died: its pipes and log closed, not left to the collector
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIE_")}
    env["HF_HUB_OFFLINE"] = "1"
    if python_path is not None:
        env["PYTHONPATH"] = str(python_path)
    # A file, not a pipe: nothing ever blocks on it; closed by _stop at exit.
    log = tempfile.TemporaryFile("w+")  # noqa: SIM115
    process = subprocess.Popen(
        [sys.executable, str(HARNESS), "--serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        env=env,
    )
    _harnesses[key] = (process, log)
    return process, log


def _discard(key: str) -> None:
    """Stop the harness of ``key`` if there is one, and close its pipes and log."""
    found = _harnesses.pop(key, None)
    if found is None:
        return
    process, log = found
    if process.stdin is not None:
        with contextlib.suppress(BrokenPipeError):  # it died with a line unread
            process.stdin.close()  # its loop ends with stdin
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    if process.stdout is not None:
        process.stdout.close()
    log.close()


@atexit.register
def _stop() -> None:
    for key in list(_harnesses):
        _discard(key)
