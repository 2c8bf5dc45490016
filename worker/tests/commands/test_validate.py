"""``sie-worker validate``: exit codes, one line per problem, and golden refusal messages.

Golden cases live in ``golden/config/NAME.yaml``: the first line is the command
(``# sie-worker validate NAME.yaml [--devices LIST]``), an optional ``# env: K=V ...`` line
sets variables, and ``NAME.out`` holds the exact output. ``SIE_UPDATE_GOLDEN=1`` rewrites
the ``.out`` files. The README's config reference shows every golden output verbatim.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from sie_worker.cli import main

ROOT = Path(__file__).resolve().parents[3]
GOLDEN = Path(__file__).with_name("golden") / "config"
EXAMPLES = ROOT / "values-examples" / "models"
SEED = EXAMPLES / "my-large-model.yaml"
CASES = sorted(GOLDEN.glob("*.yaml"))


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No SIE_* variable and an empty Hugging Face cache unless a test sets them."""
    for key in list(os.environ):
        if key.startswith("SIE_") and key != "SIE_UPDATE_GOLDEN":
            monkeypatch.delenv(key)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _header(case: Path) -> tuple[list[str], dict[str, str]]:
    lines = case.read_text(encoding="utf-8").splitlines()
    command = shlex.split(lines[0].removeprefix("#"))
    assert command[:2] == ["sie-worker", "validate"], f"{case.name}: first line is the command"
    env: dict[str, str] = {}
    if lines[1].startswith("# env:"):
        env = dict(item.split("=", 1) for item in shlex.split(lines[1].removeprefix("# env:")))
    return command[1:], env


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_golden_refusal_messages(
    case: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args, env = _header(case)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(GOLDEN)
    code = main(args)
    out = capsys.readouterr().out.replace(str(GOLDEN), ".")
    expected = case.with_suffix(".out")
    if os.environ.get("SIE_UPDATE_GOLDEN"):
        expected.write_text(out, encoding="utf-8")
    assert code == 1
    assert out == expected.read_text(encoding="utf-8")
    assert all(line.startswith(f"{case.name}: $") for line in out.splitlines())


def test_readme_shows_every_golden_refusal() -> None:
    # The golden cases are shown in the docs: the refusals page, and Multi-LoRA's on the
    # model configs page.
    readme = "".join((ROOT / "docs" / p).read_text(encoding="utf-8")
                     for p in ("refusals.md", "model-configs.md"))  # fmt: skip
    missing = [
        f"{case.name}: {line}"
        for case in CASES
        for line in case.with_suffix(".out").read_text(encoding="utf-8").splitlines()
        if line not in readme
    ]
    assert not missing, "README config reference lacks: " + "\n".join(missing)


def test_seed_example_is_valid(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(SEED)]) == 0
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "sie-worker validate: 1 config file(s) valid\n"


def test_every_example_passes_read_and_load_time_checks_on_eight_gpus(
    capsys: pytest.CaptureFixture[str],
) -> None:
    devices = ",".join(f"cuda:{i}" for i in range(8))
    assert main(["validate", str(EXAMPLES), "--devices", devices]) == 0, capsys.readouterr().out


def test_tp_abbreviation_exits_1_naming_the_full_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(SEED.read_text() + '    extra_launch_args: ["--tp=2"]\n')
    assert main(["validate", str(path)]) == 1
    [line] = capsys.readouterr().out.splitlines()
    assert line.startswith(f"{path}: $.profiles.default.extra_launch_args[0]: '--tp=2' ")
    assert "--tensor-parallel-size/--tp-size" in line


def test_load_time_rules_run_only_with_devices(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", str(SEED)]) == 0
    assert main(["validate", str(SEED), "--devices", "cuda:0,cuda:1"]) == 1
    out = capsys.readouterr().out
    assert "4 needs 4 GPUs but this worker has 2 device(s)" in out


def test_every_file_is_reported_and_duplicates_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("sie_id: x\n")
    copy = tmp_path / "copy.yaml"
    copy.write_text(SEED.read_text())
    assert main(["validate", str(SEED), str(bad), str(copy), str(tmp_path / "gone.yaml")]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert {line.split(": ", 2)[0] for line in lines} == {
        str(bad),
        str(copy),
        str(tmp_path / "gone.yaml"),
    }
    assert any("also declared in" in line for line in lines)


def test_unusable_environment_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SIE_MODEL_READY_TIMEOUT_S", "soon")
    assert main(["validate", str(SEED), "--devices", "cuda:0"]) == 2
    assert "SIE_MODEL_READY_TIMEOUT_S" in capsys.readouterr().err


def test_bad_devices_list_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(SEED), "--devices", "gpu0"]) == 2
    assert "SIE_DEVICES" in capsys.readouterr().err


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sie_worker", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith("SIE_")},
    )


def test_validate_runs_as_a_real_command() -> None:
    good = _run("validate", str(SEED))
    assert (good.returncode, good.stdout) == (0, "")
    assert "1 config file(s) valid" in good.stderr
    bad = _run("validate", str(SEED), str(GOLDEN / "reserved-flags.yaml"))
    assert bad.returncode == 1
    assert bad.stdout == (GOLDEN / "reserved-flags.out").read_text().replace(
        "reserved-flags.yaml", str(GOLDEN / "reserved-flags.yaml")
    )


def _catalogue_like(tmp_path: Path) -> Path:
    """A folder like SIE's catalogue: a servable config, one SIE serves with another bundle,
    one with a profile of each, and a broken one."""
    served = SEED.read_text()
    candle = (
        "sie_id: BAAI/bge-small-en-v1.5\nhf_id: BAAI/bge-small-en-v1.5\n"
        "tasks: {encode: {dense: {dim: 384}}, score: null}\nmax_sequence_length: 512\n"
        "profiles:\n  candle:\n"
        "    adapter_path: sie_server_rust.adapters.candle:CandleEmbeddingAdapter\n"
    )
    mixed = candle.replace("BAAI/bge-small-en-v1.5", "BAAI/bge-base-en-v1.5") + (
        "  default:\n    adapter_path: sie_server.adapters.bert_flash:BertFlashAdapter\n"
    )
    for name, text in [
        ("a.yaml", served),
        ("b.yaml", candle),
        ("c.yaml", mixed),
        ("d.yaml", "sie_id: x\n"),
    ]:
        (tmp_path / name).write_text(text)
    return tmp_path


def test_validate_summarises_each_kind_of_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _catalogue_like(tmp_path)
    assert main(["validate", str(folder)]) == 1
    captured = capsys.readouterr()
    assert all(line.startswith(str(folder / "d.yaml")) for line in captured.out.splitlines())
    assert captured.err.splitlines() == [
        "sie-worker validate: 1 config file(s) valid",
        "sie-worker validate: 1 config file(s) valid, not served by this image (adapter: files): "
        "sie_server_rust.adapters.candle:CandleEmbeddingAdapter: 1",
        "sie-worker validate: 1 config file(s) valid, some profiles not served by this image "
        "(adapter: profiles): sie_server_rust.adapters.candle:CandleEmbeddingAdapter: 1",
        "sie-worker validate: 1 config file(s) invalid",
    ]
    (folder / "d.yaml").unlink()
    assert main(["validate", str(folder)]) == 0


def test_load_time_rules_skip_profiles_this_image_does_not_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _catalogue_like(tmp_path)
    (folder / "a.yaml").unlink()
    (folder / "d.yaml").unlink()
    assert main(["validate", str(folder), "--devices", "cpu"]) == 0, capsys.readouterr().out
