"""`make check`, the inner loop: every step of `make test` but the real engines' and the
cluster's, with the same closing table; and the engines table of scripts/test, from which
the engine steps, the main step's markers and `make test`'s setups follow."""

from __future__ import annotations

import configparser
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.repo import ROOT, make_dry_run


def _steps(*args: str) -> list[str]:
    result = subprocess.run(
        ["scripts/test", "--list", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def _engines() -> list[str]:
    """The markers of the real engines' steps ("pytest vllm" -> "vllm")."""
    return [s.split()[1] for s in _steps() if s.startswith("pytest ") and s != "pytest cluster"]


def test_make_check_sets_up_python_and_the_tools_then_runs_the_check_steps() -> None:
    assert make_dry_run("check").splitlines() == [
        "scripts/setup",
        "scripts/setup-tools --no-cluster",
        "scripts/test --check",
    ]


def test_the_check_steps_are_every_step_but_the_real_engines_and_the_cluster() -> None:
    check, every = _steps("--check"), _steps()
    engines = [f"pytest {marker}" for marker in _engines()]
    assert engines[:2] == ["pytest vllm", "pytest sglang"]
    assert check == [s for s in every if s not in {*engines, "pytest cluster"}]
    assert "pytest" in check
    assert "mypy" in check


def test_every_engine_is_set_up_by_make_test_and_its_marker_is_registered() -> None:
    setups = re.search(r"for engine in ([\w ]+); do scripts/setup-\$engine", make_dry_run("test"))
    assert setups is not None
    assert setups[1].split() == _engines()
    ini = configparser.ConfigParser()
    ini.read(ROOT / "pytest.ini")
    registered = {line.split(":", 1)[0].strip() for line in ini["pytest"]["markers"].splitlines()}
    assert set(_engines()) <= registered
    for marker in _engines():
        assert (ROOT / "scripts" / f"setup-{marker}").is_file(), marker


def test_the_main_pytest_step_leaves_out_every_engine_and_the_cluster() -> None:
    result = subprocess.run(
        ["scripts/test", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    selection = result.stdout.rsplit("The pytest step's selection: -m ", 1)[1]
    expected = " and ".join(f"not {m}" for m in ["cluster", *_engines()])
    assert selection.splitlines()[0] == f'"{expected}"'
    # The inner loop leaves out torch too, and the guard fails whatever reaches it unmarked.
    assert f'With --check: -m "{expected} and not torch", tests/support/no_torch' in result.stdout


def test_make_checks_guard_fails_an_import_of_torch_naming_the_mark() -> None:
    guard = ROOT / "tests" / "support" / "no_torch"
    result = subprocess.run(
        [sys.executable, "-c", "import torch"],
        env={**os.environ, "PYTHONPATH": str(guard)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "make check runs no test that imports torch" in result.stderr
    assert "mark the test `torch` (pytest.ini)" in result.stderr
    ini = configparser.ConfigParser()
    ini.read(ROOT / "pytest.ini")
    assert "torch: imports torch" in ini["pytest"]["markers"]


def test_make_help_and_the_readme_name_make_check() -> None:
    help_text = subprocess.run(
        ["make", "--no-print-directory", "help"], cwd=ROOT, capture_output=True, text=True
    ).stdout
    assert "make check" in help_text
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "`make check`" in readme
    assert readme.index("make test") < readme.index("`make check`")


def test_children_cpu_counts_the_cpu_seconds_of_the_processes_a_step_ran() -> None:
    # The closing table's cpu column: what a step's processes used, as their parents reaped
    # them; here a child that spins for 2.2 CPU-seconds, and one that sleeps.
    script = (
        "source scripts/lib.sh\n"
        "children_cpu; before=$cpu_now\n"
        f"{sys.executable} -c 'import time\nt = time.process_time()\n"
        "while time.process_time() - t < 2.2: pass'\n"
        "sleep 1\n"
        "children_cpu; echo $((cpu_now - before))\n"
    )
    result = subprocess.run(
        ["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert 2 <= int(result.stdout.split()[-1]) <= 3  # whole seconds; the sleep adds none


def test_the_closing_table_gives_each_steps_time_and_cpu_seconds() -> None:
    result = subprocess.run(
        ["scripts/test", "ruff format"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout
    lines = result.stdout.splitlines()
    header = lines.index(next(line for line in lines if line.startswith("step ")))
    assert lines[header].split() == ["step", "result", "time", "cpu", "note"]
    assert re.fullmatch(r"ruff format +pass +\d+s +\d+s\s*", lines[header + 1])
    assert lines[-1] == "checks: 1 passed, 0 failed, 0 skipped"


def test_a_steps_cpu_counts_the_processes_it_left_behind(tmp_path: Path) -> None:
    # An engine's ranks outlive a launcher a test killed; scripts/test reaps such orphans
    # itself, so their CPU counts. Here the step's command leaves a child spinning for 2.2
    # CPU-seconds and exits while it runs (a copy of scripts/test, its hadolint a stand-in).
    tools = _copy_of_scripts_test(tmp_path)
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 2.2: pass"
    (tools / "hadolint").write_text(
        f"#!/usr/bin/env bash\n({sys.executable} -c '{spin}' &)\nsleep 4\n"
    )
    (tools / "hadolint").chmod(0o755)
    result = _run_copy(tmp_path, "hadolint")
    assert result.returncode == 0, result.stdout + result.stderr
    row = next(line for line in result.stdout.splitlines() if line.startswith("hadolint "))
    assert 2 <= int(row.split()[3].rstrip("s")) <= 3, row


def test_an_engine_step_runs_as_many_of_its_modules_at_once_as_its_table_line_says(
    tmp_path: Path,
) -> None:
    # A copy of scripts/test whose pytest is a stand-in recording its arguments, and whose
    # engines look installed.
    tools = _copy_of_scripts_test(tmp_path)
    calls = tmp_path / "calls"
    (tools / "pytest").write_text(f'#!/usr/bin/env bash\necho "$*" >>{calls}\n')
    table = re.search(
        r"^engines=\(\n(.*?)^\)", (ROOT / "scripts" / "test").read_text(), re.M | re.S
    )
    assert table is not None
    lines = [line.strip().strip('"').split() for line in table[1].splitlines()]
    for marker, installed, _setup, at_once in lines:
        assert int(at_once) >= 1, marker
        (tmp_path / installed).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / installed).write_text("#!/bin/sh\n")
        (tmp_path / installed).chmod(0o755)
    (tools / "pytest").chmod(0o755)
    result = _run_copy(tmp_path, *(f"pytest {line[0]}" for line in lines))
    assert result.returncode == 0, result.stdout + result.stderr
    ran = calls.read_text().splitlines()
    assert len(ran) == len(lines)
    for (marker, _installed, _setup, at_once), argv in zip(lines, ran, strict=True):
        assert argv.endswith(f"-m {marker}"), argv
        assert (f"-n {at_once} --dist loadfile" in argv) == (int(at_once) > 1), argv
    assert {"vllm", "sglang"} <= {line[0] for line in lines if int(line[3]) > 1}


def _copy_of_scripts_test(root: Path) -> Path:
    """scripts/test and its library copied under ``root``; the tools folder for stand-ins."""
    (root / "scripts").mkdir()
    for name in ("test", "lib.sh"):
        shutil.copy2(ROOT / "scripts" / name, root / "scripts" / name)
    tools = root / ".tools" / "bin"
    tools.mkdir(parents=True)
    return tools


def _run_copy(root: Path, *steps: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SIE_TEST_REAPER"}
    return subprocess.run(
        [str(root / "scripts" / "test"), *steps],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
