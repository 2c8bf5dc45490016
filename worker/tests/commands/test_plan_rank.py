"""``sie-worker plan --rank K``: rank K of a model that a group of nodes serves, as
docs/groups-of-nodes.md shows it."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from sie_worker.cli import main
from sie_worker.worker.launcher.ports import ENGINE_PORTS

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "groups-of-nodes.md"
MODEL = "meta-llama/Llama-3.1-405B-Instruct-FP8"
LEADER = "sie-gpu-8x80-0.sie-gpu-8x80.default"
EIGHT = ",".join(f"cuda:{i}" for i in range(8))


@pytest.fixture(autouse=True)
def group_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for key in list(os.environ):
        if key.startswith("SIE_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    env = {
        "SIE_BUNDLE": "sglang",
        "SIE_NODES": "2",
        "SIE_LEADER_ADDRESS": LEADER,
        "SIE_PINNED_MODELS": MODEL,
        "SIE_FAKE_MEMORY_BUDGET": "80GiB",
        "SIE_DEVICES": EIGHT,
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)


def _page_config(tmp_path: Path) -> Path:
    """The config the page shows (its first yaml block that names the model)."""
    blocks = re.findall(r"```yaml\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.S)
    [config] = [b for b in blocks if b.startswith(f"sie_id: {MODEL}")]
    path = tmp_path / "llama-405b.yaml"
    path.write_text(config)
    return path


def _plan(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any], str]:
    code = main(["plan", *args])
    captured = capsys.readouterr()
    return code, json.loads(captured.out) if code == 0 else {}, captured.err


def test_the_pages_rank_1_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, result, _ = _plan(capsys, str(_page_config(tmp_path)), "--rank", "1")
    assert code == 0
    assert list(result) == [
        "model", "width", "devices", "argv", "env", "rank", "nodes", "rendezvous", "memory_bytes"
    ]  # fmt: skip
    assert (result["model"], result["width"], result["rank"], result["nodes"]) == (
        MODEL,
        16,
        1,
        2,
    )
    assert result["devices"] == EIGHT.split(",")
    assert result["env"] == {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}
    assert result["rendezvous"] == f"{LEADER}:30400"
    assert result["memory_bytes"] == 74088185856
    argv = result["argv"]
    port = argv[argv.index("--port") + 1]
    assert int(port) in ENGINE_PORTS
    shown = PAGE.read_text(encoding="utf-8")
    # The page's argv, as printed, with its example port.
    expected = " ".join(f'"{a}",' for a in argv[3:]).replace(port, "30218").rstrip(",")
    folded = re.sub(r"\s+", " ", shown)
    assert expected in folded


def test_rank_0_leads_and_the_rank_is_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = str(_page_config(tmp_path))
    code, result, _ = _plan(capsys, config, "--rank", "0")
    assert code == 0
    assert result["argv"][result["argv"].index("--node-rank") + 1] == "0"
    code, _, err = _plan(capsys, config, "--rank", "2")
    assert code == 2
    assert "SIE_NODE_RANK: must be an integer from 0 to 1 (SIE_NODES=2), got '2'" in err


def test_rank_needs_the_group_variables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SIE_NODES")
    code, _, err = _plan(capsys, str(_page_config(tmp_path)), "--rank", "1")
    assert code == 2
    assert "--rank needs SIE_NODES" in err


def test_an_unpinned_model_is_planned_as_pinned_with_a_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SIE_PINNED_MODELS", "org/first")
    code, result, err = _plan(capsys, str(_page_config(tmp_path)), "--rank", "1")
    assert code == 0
    assert f"SIE_PINNED_MODELS lacks {MODEL}" in err
    assert result["rendezvous"] == f"{LEADER}:30401"  # after the one pinned model


def test_rank_of_a_model_that_fits_one_worker_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "small.yaml"
    text = _page_config(tmp_path).read_text().replace("pipeline_parallel_size: 2", "")
    path.write_text(text)
    code, _, err = _plan(capsys, str(path), "--rank", "1")
    assert code == 2
    assert "fits this worker's 8 device(s), so one worker serves it" in err


def test_a_vllm_follower_runs_vllm_serve_headless(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SIE_BUNDLE", "vllm")
    path = tmp_path / "vllm.yaml"
    text = _page_config(tmp_path).read_text()
    path.write_text(
        text.replace(
            "sglang.generation:SGLangGenerationAdapter", "vllm.generation:VLLMGenerationAdapter"
        )
    )
    code, result, _ = _plan(capsys, str(path), "--rank", "1")
    assert code == 0
    argv = result["argv"]
    assert argv[1:4] == ["-m", "vllm.entrypoints.cli.main", "serve"]
    assert " ".join(argv[4:]).startswith(f"--model {MODEL} --served-model-name {MODEL}")
    assert argv[argv.index("--master-addr") + 1] == LEADER
    assert "--headless" in argv


def test_help_describes_rank(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    out = capsys.readouterr().out
    assert "--rank K" in out
    assert "plan rank K of a group of nodes" in out
