"""``sie-worker size``'s layout through the command: TP x PP inside a node when no tensor width
alone holds the model, PP over PCIe (seed 004), and MoE from config.json's expert count."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from sie_worker.cli import main

GB = 1e9


def _model(tmp_path: Path, config_json: dict[str, Any], *, checkpoint_bytes: float) -> Path:
    """A model config whose model_path holds ``config_json`` and a safetensors index."""
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({**config_json, "torch_dtype": "bfloat16"}))
    index = {"metadata": {"total_size": int(checkpoint_bytes)}, "weight_map": {}}
    (model_dir / "model.safetensors.index.json").write_text(json.dumps(index))
    config = tmp_path / "model.yaml"
    config.write_text(
        "sie_id: test-org/model\nhf_id: test-org/model\nmodel_path: model\n"
        "tasks:\n  generate:\n    context_length: 1024\n"
        "profiles:\n  default:\n    compute_precision: bfloat16\n"
        "    adapter_path: sie_server.adapters.sglang.generation:SGLangGenerationAdapter\n"
        "    adapter_options:\n      loadtime:\n        tensor_parallel_size: 1\n"
    )
    return config


def _size(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[dict[str, Any], str]:
    """``size``'s JSON and its table for the same arguments."""
    assert main(["size", *argv, "--json"]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert main(["size", *argv]) == 0
    table = capsys.readouterr().out
    assert max(len(line) for line in table.splitlines()) <= 80
    return out, table


_FOURTEEN_HEADS = {"num_hidden_layers": 40, "num_attention_heads": 14, "num_key_value_heads": 2,
                   "head_dim": 128}  # fmt: skip


def test_size_splits_a_model_no_tensor_width_holds_by_tp_and_pp_inside_the_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 14 heads allow widths 1, 2, 7; four GPUs of a 4-GPU node hold 250 GB: TP=2 x PP=2.
    config = _model(tmp_path, _FOURTEEN_HEADS, checkpoint_bytes=250 * GB)
    out, table = _size(capsys, str(config), "--gpu-type", "h100", "--gpus-per-node", "4",
                       "--context", "1024", "--sequences", "1")  # fmt: skip
    layout = out["layout"]
    assert layout["summary"] == "needs 4 GPU(s) -> TP=2, PP=2 inside a node"
    assert (layout["tensor_parallel_size"], layout["pipeline_parallel_size"]) == (2, 2)
    assert (layout["nodes"], layout["gpus_per_rank"], layout["replicas"]) == (1, 4, 1)
    assert out["width"] == 4
    assert out["pool"]["gpu"] == {"count": 4, "deviceGroup": True}
    assert re.search(r"^layout\s+needs 4 GPU\(s\) -> TP=2, PP=2 inside a node$", table, re.M)
    assert (
        "model config (profiles.<name>.adapter_options.loadtime):\n"
        "  tensor_parallel_size: 2\n  pipeline_parallel_size: 2\n"
    ) in table


def test_size_over_pcie_splits_32b_on_two_24_gb_cards_by_stages(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Seed 004, Example 14: "32B 4.5-bit, 2 x 24 GB PCIe -> PP=2 (PCIe: communicate once per
    # stage)", here from a config.json (Qwen2.5-32B's shape).
    shape = {"num_hidden_layers": 64, "num_attention_heads": 40, "num_key_value_heads": 8,
             "head_dim": 128}  # fmt: skip
    config = _model(tmp_path, shape, checkpoint_bytes=65.6 * GB)
    argv = [str(config), "--gpu-memory", "24GB", "--gpus-per-node", "2", "--params", "32.8B",
            "--bits", "4.5", "--context", "8192", "--sequences", "4"]  # fmt: skip
    out, table = _size(capsys, *argv, "--interconnect", "pcie")
    assert out["layout"]["summary"] == "needs 2 GPU(s) -> PP=2 (PCIe: communicate once per stage)"
    assert (out["layout"]["tensor_parallel_size"], out["layout"]["pipeline_parallel_size"]) == (
        1,
        2,
    )
    assert "  tensor_parallel_size: 1\n  pipeline_parallel_size: 2\n" in table
    out, table = _size(capsys, *argv, "--interconnect", "nvlink")
    assert out["layout"]["summary"] == "needs 2 GPU(s) -> TP=2"
    assert "pipeline_parallel_size:" not in table


# Qwen3-235B-A22B's shape: seed 004's "MoE 235B FP8, 8 x 80 GB NVLink".
_QWEN3_MOE = {"num_hidden_layers": 94, "num_attention_heads": 64, "num_key_value_heads": 4,
              "head_dim": 128, "num_experts": 128}  # fmt: skip
_SEED_MOE = ["--params", "235B", "--bits", "8", "--gpu-memory", "80GB", "--usable", "0.6",
             "--nodes", "1", "--context", "1024", "--sequences", "1"]  # fmt: skip


def test_size_reads_moe_from_the_expert_count_in_config_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _model(tmp_path, _QWEN3_MOE, checkpoint_bytes=470 * GB)
    out, table = _size(capsys, str(config), *_SEED_MOE)
    assert out["layout"]["summary"] == "needs 5 GPU(s) -> TP=8, expert parallel for the MoE layers"
    assert (out["moe"], out["moe_source"]) == (True, "config.json: 128 routed experts")
    assert out["shape"]["experts"] == 128
    assert "routed experts" in table
    assert re.search(r"^MoE\s+yes \(config\.json: 128 routed experts\)", table, re.M)
    # --no-moe overrides config.json.
    out, table = _size(capsys, str(config), *_SEED_MOE, "--no-moe")
    assert out["layout"]["summary"] == "needs 5 GPU(s) -> TP=8"
    assert (out["moe"], out["moe_source"]) == (False, "--no-moe")
    assert not re.search(r"^MoE", table, re.M)


def test_moe_flag_marks_a_model_whose_config_json_names_no_experts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dense = {key: value for key, value in _QWEN3_MOE.items() if key != "num_experts"}
    config = _model(tmp_path, dense, checkpoint_bytes=470 * GB)
    out, _ = _size(capsys, str(config), *_SEED_MOE)
    assert (out["moe"], out["moe_source"]) == (False, "config.json: no routed experts")
    assert out["layout"]["expert_parallel"] is False
    out, _ = _size(capsys, str(config), *_SEED_MOE, "--moe")
    assert (out["moe"], out["moe_source"]) == (True, "--moe")
    assert out["layout"]["expert_parallel"] is True


def test_size_refuses_a_bad_expert_count_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _model(tmp_path, {**_QWEN3_MOE, "num_experts": 2.5}, checkpoint_bytes=470 * GB)
    assert main(["size", str(config), *_SEED_MOE]) == 1
    err = capsys.readouterr().err
    assert "num_experts is 2.5, expected a whole number of experts" in err
