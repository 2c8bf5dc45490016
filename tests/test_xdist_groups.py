"""pytest-xdist keeps a module whose tests share a module fixture on one worker.

The root conftest marks such tests with an ``xdist_group`` and scripts/test runs
``--dist loadgroup``. That only holds while the pinned pytest and pytest-xdist agree on how a
node id is stored: with pytest 9.2 and xdist 3.8 the groups were silently ignored, and every
module of real engines started them once per worker (a minute of setup lost per module). This
runs a real two-worker session in a subprocess, with the root conftest's hook, and reads which
process ran each test.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.repo import ROOT

_CONFTEST = f"""
import importlib.util

_spec = importlib.util.spec_from_file_location("root_conftest", {str(ROOT / "conftest.py")!r})
_root = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_root)
pytest_collection_modifyitems = _root.pytest_collection_modifyitems
"""

# Two modules with a module fixture (their tests must each stay on one worker) and free tests
# that keep the other worker busy, so a split would show.
_SHARED = """
import json, os, time
import pytest

def _log(request, name, *row):
    with (request.config.rootpath / name).open("a") as f:
        f.write(json.dumps([__name__, os.getpid(), *row]) + "\\n")

@pytest.fixture(scope="module")
def shared(request):
    _log(request, "setups.jsonl")

@pytest.mark.parametrize("n", range(6))
def test_shared(shared, n, request):
    time.sleep(0.05)
    _log(request, "runs.jsonl", n)
"""

_FREE = """
import time
import pytest

@pytest.mark.parametrize("n", range(12))
def test_free(n):
    time.sleep(0.05)
"""


def test_a_module_sharing_a_fixture_runs_on_one_worker_and_sets_it_up_once(
    tmp_path: Path,
) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "conftest.py").write_text(_CONFTEST)
    (tmp_path / "test_shared_a.py").write_text(_SHARED)
    (tmp_path / "test_shared_b.py").write_text(_SHARED)
    (tmp_path / "test_free.py").write_text(_FREE)
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    run = subprocess.run(
        [*argv, "-n", "2", "--dist", "loadgroup"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    runs = _rows(tmp_path / "runs.jsonl")
    setups = _rows(tmp_path / "setups.jsonl")
    assert len(runs) == 12
    for module in ("test_shared_a", "test_shared_b"):
        workers = {row[1] for row in runs if row[0] == module}
        assert len(workers) == 1, f"{module} ran on {len(workers)} workers: {runs}"
        assert [row for row in setups if row[0] == module] == [[module, *workers]], setups


def _rows(path: Path) -> list[list[object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]
