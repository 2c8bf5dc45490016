from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.support.sizing_figures import (
    LLAMA,
    SEED_004_LAYOUT_USABLE,
    SEED_004_LAYOUTS,
    SEED_004_TABLE,
)

from sie_worker.cli import main
from sie_worker.sizing.gpus import GPU_MEMORY_BYTES

GB = 1e9
REPO = Path(__file__).resolve().parents[3]


def _model(
    tmp_path: Path,
    shape: dict[str, Any],
    *,
    checkpoint_bytes: float | None = None,
    width: int = 1,
    kv_budget_tokens: int | None = None,
    context_length: int = 8192,
) -> Path:
    """A model config whose model_path holds a synthetic config.json (and index)."""
    model_dir = tmp_path / "model"
    model_dir.mkdir(exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps({**shape, "torch_dtype": "bfloat16"}))
    if checkpoint_bytes is not None:
        index = {"metadata": {"total_size": int(checkpoint_bytes)}, "weight_map": {}}
        (model_dir / "model.safetensors.index.json").write_text(json.dumps(index))
    loadtime = (
        "      loadtime:\n"
        f"        tensor_parallel_size: {width}\n"
        "        request_read_timeout_s: 600\n"
        "        startup_timeout_s: 900\n"
    )
    budget = f"    kv_budget_tokens: {kv_budget_tokens}\n" if kv_budget_tokens else ""
    config = tmp_path / "model.yaml"
    config.write_text(
        "sie_id: test-org/llama\n"
        "hf_id: test-org/llama\n"
        "model_path: model\n"
        f"tasks:\n  generate:\n    context_length: {context_length}\n"
        "profiles:\n  default:\n"
        "    compute_precision: bfloat16\n"
        f"{budget}"
        "    adapter_path: sie_server.adapters.sglang.generation:SGLangGenerationAdapter\n"
        "    adapter_options:\n"
        f"{loadtime}"
    )
    return config


def _size_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main(["size", *argv, "--json"]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


@pytest.mark.parametrize(("name", "bits", "weights", "kv", "total", "gpus"), SEED_004_TABLE)
def test_size_reproduces_seed_004_why_split_table_from_config_json(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    name: str,
    bits: float,
    weights: float,
    kv: float,
    total: float,
    gpus: int,
) -> None:
    params, shape = LLAMA[name]
    # The BF16 checkpoint's bytes come from the safetensors index; other precisions
    # rescale its parameter count with --bits.
    config = _model(tmp_path, shape, checkpoint_bytes=params * 2)
    bits_args = [] if bits == 16 else ["--bits", str(bits)]
    out = _size_json(
        capsys, str(config), "--gpu-memory", "80GB", "--usable", "0.9",
        "--context", "8192", "--sequences", "32", *bits_args,
    )  # fmt: skip
    assert round(out["weights_bytes"] / GB, 1) == weights
    assert round(out["kv_bytes_total"] / GB, 1) == kv
    assert round(out["total_bytes"] / GB, 1) == total
    assert out["min_gpus"] == gpus
    assert out["params"] == pytest.approx(params)


@pytest.mark.parametrize(("name", "kib"), [("8B", 128), ("70B", 320), ("405B", 504)])
def test_size_reports_seed_004_kv_per_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, kib: int
) -> None:
    params, shape = LLAMA[name]
    config = _model(tmp_path, shape, checkpoint_bytes=params * 2)
    out = _size_json(capsys, str(config), "--gpu-type", "h100")
    assert out["kv_bytes_per_token"] == kib * 1024


def test_size_gives_405b_bf16_a_group_of_two_nodes_with_its_pool_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 14 GPUs at 90% (seed 004's "why split" row): more than a node of 8, so TP=8 x PP=2.
    params, shape = LLAMA["405B"]
    config = _model(tmp_path, shape, checkpoint_bytes=params * 2)
    argv = [str(config), "--gpu-type", "h100", "--sequences", "32"]
    out = _size_json(capsys, *argv)
    assert out["min_gpus"] == 14
    assert out["width"] == 16
    assert "pipeline_parallel_size 2" in out["width_reason"]
    assert out["pool"]["gpu"] == {"count": 8, "deviceGroup": True, "nodes": 2}
    assert out["replicas_per_node"] is None
    layout = out["layout"]
    assert layout["summary"] == "needs 14 GPU(s) -> TP=8 inside a node, PP=2 across nodes"
    assert (layout["tensor_parallel_size"], layout["pipeline_parallel_size"]) == (8, 2)
    assert (layout["nodes"], layout["gpus_per_rank"], layout["replicas"]) == (2, 8, 1)
    assert main(["size", *argv]) == 0
    table = capsys.readouterr().out
    assert max(len(line) for line in table.splitlines()) <= 80
    assert "    count: 8\n    deviceGroup: true\n    nodes: 2\n  shmSize: 64Gi\n" in table
    assert (
        "model config (profiles.<name>.adapter_options.loadtime):\n"
        "  tensor_parallel_size: 8\n  pipeline_parallel_size: 2\n"
    ) in table
    assert re.search(r"^layout\s+needs 14 GPU\(s\) -> TP=8 inside a node, PP=2", table, re.M)


def _weights_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A model config with no config.json anywhere: ``size`` needs --params."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    config = tmp_path / "remote.yaml"
    config.write_text(
        "sie_id: test-org/remote\nhf_id: test-org/remote\n"
        "tasks:\n  generate:\n    context_length: 8192\nprofiles:\n  default: {}\n"
    )
    return config


@pytest.mark.parametrize("row", SEED_004_LAYOUTS, ids=[row[0] for row in SEED_004_LAYOUTS])
def test_size_prints_seed_004_example_14_layouts(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    row: tuple[Any, ...],
) -> None:
    """Seed 004, Example 14 ("choosing a layout"): the six setups through the command, the
    weights as the seed gives them in GB (--params G --bits 8 is G GB) at its 60% rule."""
    _, weights, gpu, per_node, nodes, nvlink, moe, line, need, tp, pp, span, dp, ep = row
    argv = [str(_weights_only(tmp_path, monkeypatch)), "--params", f"{weights}B", "--bits", "8",
            "--gpu-memory", f"{gpu}GB", "--usable", str(SEED_004_LAYOUT_USABLE),
            "--gpus-per-node", str(per_node), "--nodes", str(nodes),
            "--interconnect", "nvlink" if nvlink else "pcie"]  # fmt: skip
    argv += ["--moe"] if moe else []
    assert main(["size", *argv]) == 0
    assert re.search(rf"^layout {{8}}{re.escape(line)}$", capsys.readouterr().out, re.M)
    out = _size_json(capsys, *argv)
    assert round(out["weights_bytes"] / GB, 1) == weights
    layout = out["layout"]
    assert layout["summary"] == line
    assert (layout["gpus_needed"], layout["tensor_parallel_size"]) == (need, tp)
    assert (layout["pipeline_parallel_size"], layout["nodes"]) == (pp, span)
    assert (layout["replicas"], layout["expert_parallel"]) == (dp, ep)
    assert (layout["nodes_on_hand"], layout["interconnect"]) == (
        nodes,
        "nvlink" if nvlink else "pcie",
    )
    assert out["width"] == (None if tp is None else tp * pp)


@pytest.mark.parametrize(("params", "bits", "need"), [("405B", "16", 12), ("671B", "8", 10)])
def test_frontier_models_on_8_x_80_gb_get_a_group_not_none(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    params: str,
    bits: str,
    need: int,
) -> None:
    # Issue 39: "none: weights alone need 12 (10) GPUs, more than the 8 one engine can span".
    config = _weights_only(tmp_path, monkeypatch)
    out = _size_json(capsys, str(config), "--gpu-type", "h100", "--params", params, "--bits", bits)
    assert out["min_gpus"] == need
    assert (
        out["layout"]["summary"] == f"needs {need} GPU(s) -> TP=8 inside a node, PP=2 across nodes"
    )
    assert out["pool"]["gpu"] == {"count": 8, "deviceGroup": True, "nodes": 2}


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5"])
def test_size_refuses_bad_nodes_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    config = _model(tmp_path, LLAMA["8B"][1])
    with pytest.raises(SystemExit) as exit_:
        main(["size", str(config), "--gpu-type", "h100", "--nodes", value])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --nodes: {value!r}: a whole number of nodes, at least 1, e.g. 2" in err


def test_size_help_names_the_layout_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["size", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--nodes N nodes on hand" in help_text
    assert "--interconnect {nvlink,pcie}" in help_text
    assert "pipeline stages" in help_text
    assert "--moe" in help_text


# Seed 001 gpus_needed: 140 GB (70B fp16) and 40 GB (4-bit 70B) of weights, KV reserve 40%.
@pytest.mark.parametrize(
    ("params", "context", "need_gb", "raw", "tp"),
    [("70B", 170_899, 196.0, 3, 4), ("20B", 48_829, 56.0, 1, 1)],
)
def test_size_reproduces_seed_001_gpus_needed(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    params: str,
    context: int,
    need_gb: float,
    raw: int,
    tp: int,
) -> None:
    # 0.4 x weights of KV at 320 KiB per token is `context` tokens (rounded up).
    config = _model(tmp_path, LLAMA["70B"][1])
    out = _size_json(
        capsys, str(config), "--gpu-type", "a100-80gb", "--params", params,
        "--context", str(context), "--sequences", "1",
    )  # fmt: skip
    assert round(out["total_bytes"] / GB, 1) == need_gb
    assert round(out["gpu"]["usable_bytes"] / GB, 1) == 72.0
    assert out["min_gpus"] == raw
    assert out["width"] == tp


def test_fourteen_heads_never_get_tensor_width_4(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shape = {"num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
             "hidden_size": 896}  # fmt: skip
    config = _model(tmp_path, shape)
    # 50 GB of weights on 24 GB L4s need 3 GPUs; no tensor width from 3 to 8 splits 14 heads,
    # so three pipeline stages of one GPU each: the smallest layout inside the node.
    out = _size_json(capsys, str(config), "--gpu-type", "l4", "--params", "25B")
    assert out["min_gpus"] == 3
    assert out["valid_widths"] == [1, 2]
    assert out["width"] == 3
    assert (out["layout"]["tensor_parallel_size"], out["layout"]["pipeline_parallel_size"]) == (
        1,
        3,
    )
    assert out["layout"]["summary"] == "needs 3 GPU(s) -> PP=3 inside a node, 2 replicas (DP)"
    out = _size_json(capsys, str(config), "--gpu-type", "l4", "--params", "12B")
    assert (out["min_gpus"], out["width"]) == (2, 2)


def test_defaults_come_from_the_config_context_and_kv_budget(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _model(tmp_path, LLAMA["8B"][1], kv_budget_tokens=65536, context_length=16384)
    out = _size_json(capsys, str(config), "--gpu-type", "h100", "--params", "8.03B")
    assert (out["context_tokens"], out["sequences"]) == (16384, 4)
    assert out["context_source"] == "tasks.generate.context_length"
    assert out["declared"] == {
        "tensor_parallel_size": 1,
        "pipeline_parallel_size": 1,
        "kv_budget_tokens": 65536,
    }


def test_gpu_type_defaults_to_the_chart_env(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SIE_GPU_TYPE", "h200")
    config = _model(tmp_path, LLAMA["8B"][1])
    out = _size_json(capsys, str(config), "--params", "8B")
    assert out["gpu"]["memory_bytes"] == 141 * 10**9
    assert out["gpu"]["source"] == "SIE_GPU_TYPE"


def test_config_json_is_found_in_the_hugging_face_cache(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = tmp_path / "hub" / "models--test-org--cached"
    commit = "0123456789abcdef0123456789abcdef01234567"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "config.json").write_text(json.dumps(LLAMA["70B"][1]))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    config = tmp_path / "cached.yaml"
    config.write_text(
        "sie_id: test-org/cached\nhf_id: test-org/cached\n"
        "tasks:\n  generate:\n    context_length: 8192\n"
        "profiles:\n  default:\n    compute_precision: bfloat16\n"
    )
    out = _size_json(capsys, str(config), "--gpu-type", "h100", "--params", "70B")
    assert out["config_json"] == str(repo / "snapshots" / commit / "config.json")
    assert out["shape"]["kv_heads"] == 8


def test_warns_when_a_model_that_fits_one_gpu_is_split(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    params, shape = LLAMA["8B"]
    config = _model(tmp_path, shape, checkpoint_bytes=params * 2, width=2, kv_budget_tokens=32768)
    out = _size_json(capsys, str(config), "--gpu-type", "h100")
    assert len(out["warnings"]) == 1
    assert out["warnings"][0]["path"].endswith("loadtime.tensor_parallel_size")
    assert "fits one GPU" in out["warnings"][0]["message"]
    assert out["width"] == 1


def test_warns_when_declared_width_cannot_hold_the_weights(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    params, shape = LLAMA["70B"]
    config = _model(tmp_path, shape, checkpoint_bytes=params * 2, width=1)
    assert main(["size", str(config), "--gpu-type", "h100"]) == 0
    table = capsys.readouterr().out
    assert "warning: $.profiles.default.adapter_options.loadtime.tensor_parallel_size" in table
    assert "cannot hold the weights" in " ".join(table.split())


def test_table_fits_80_columns_and_shows_the_pool(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    params, shape = LLAMA["70B"]
    config = _model(tmp_path, shape, checkpoint_bytes=params * 2, width=2, kv_budget_tokens=262144)
    assert main(["size", str(config), "--gpu-type", "h100", "--sequences", "32"]) == 0
    table = capsys.readouterr().out
    assert max(len(line) for line in table.splitlines()) <= 80
    assert re.search(r"^min GPUs\s+4 \(2 for the weights alone\)$", table, re.M)
    assert "    count: 4\n    deviceGroup: true\n  shmSize: 32Gi" in table


def test_weights_only_plan_without_config_json_needs_params(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    config = tmp_path / "remote.yaml"
    config.write_text(
        "sie_id: test-org/remote\nhf_id: test-org/remote\n"
        "tasks:\n  generate:\n    context_length: 8192\nprofiles:\n  default: {}\n"
    )
    assert main(["size", str(config), "--gpu-type", "h100"]) == 1
    err = capsys.readouterr().err
    assert "no config.json" in err
    assert "--params" in err
    out = _size_json(capsys, str(config), "--gpu-type", "h100", "--params", "70.6B")
    assert out["shape"] is None
    assert out["kv_bytes_per_token"] is None
    assert out["min_gpus"] == 2
    assert out["width"] == 2
    assert "head counts" in out["width_reason"]


def test_unknown_gpu_type_lists_the_known_ones_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _model(tmp_path, LLAMA["8B"][1])
    assert main(["size", str(config), "--gpu-type", "a100", "--params", "8B"]) == 1
    err = capsys.readouterr().err
    assert "unknown GPU type 'a100'" in err
    assert all(name in err for name in GPU_MEMORY_BYTES)


def test_no_gpu_named_is_an_error_that_names_the_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SIE_GPU_TYPE", raising=False)
    config = _model(tmp_path, LLAMA["8B"][1])
    assert main(["size", str(config), "--params", "8B"]) == 1
    err = capsys.readouterr().err
    assert "--gpu-type" in err
    assert "--gpu-memory" in err


def test_invalid_config_prints_its_problems_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("sie_id: x\n")
    assert main(["size", str(config), "--gpu-type", "h100"]) == 1
    assert str(config) in capsys.readouterr().err


def test_every_json_field_is_documented_in_the_readme(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    params, shape = LLAMA["70B"]
    config = _model(tmp_path, shape, checkpoint_bytes=params * 2)
    out = _size_json(capsys, str(config), "--gpu-type", "h100")
    section = (REPO / "docs" / "sizing.md").read_text(encoding="utf-8")
    nested = [f"{k}" for v in out.values() if isinstance(v, dict) for k in v]
    missing = [k for k in [*out, *nested] if f"`{k}`" not in section and k not in section]
    assert missing == []


def test_size_runs_as_a_real_command(tmp_path: Path) -> None:
    params, shape = LLAMA["8B"]
    config = _model(tmp_path, shape, checkpoint_bytes=params * 2)
    result = subprocess.run(
        [sys.executable, "-m", "sie_worker", "size", str(config), "--gpu-type", "l4", "--json"],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    # 16.1 GB of weights on a 24 GB L4 at 0.9 (21.6 GB): one GPU, 5.5 GB left for KV.
    assert out["width"] == 1
    assert out["kv_budget_bytes_per_replica"] == round(21.6e9 - 16.06e9)


def test_chart_readme_worked_example_matches_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    readme = (REPO / "chart" / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Sizing\n", 1)[1].split("\n## ", 1)[0]
    config_text = section.split("```yaml\n# llama-70b.yaml\n", 1)[1].split("```", 1)[0]
    console = section.split("```console\n", 1)[1].split("```", 1)[0]
    command = "$ sie-worker size llama-70b.yaml --gpu-type h100\n"
    shown = console.split(command, 1)[1]
    # The HF cache as `hf download` leaves it: config.json and the index of seed 004's 70B.
    params, shape = LLAMA["70B"]
    snapshot = tmp_path / "hub" / "models--meta-llama--Llama-3.1-70B-Instruct" / "snapshots" / "c"
    snapshot.mkdir(parents=True)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("c" * 40)
    snapshot = snapshot.rename(snapshot.parent / ("c" * 40))
    (snapshot / "config.json").write_text(json.dumps({**shape, "torch_dtype": "bfloat16"}))
    index = {"metadata": {"total_size": int(params * 2)}, "weight_map": {}}
    (snapshot / "model.safetensors.index.json").write_text(json.dumps(index))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "llama-70b.yaml").write_text(config_text)
    assert main(["size", "llama-70b.yaml", "--gpu-type", "h100"]) == 0
    assert capsys.readouterr().out == shown


# Seed 004, Example 17: an 8B BF16 model (16.1 GB) and a 70B FP8 one (70.6 GB).
SEED_004_COLD_STARTS = {
    "8B": ("8.05B", "16", [(128.8, 188.8), (16.1, 76.1), (5.4, 65.4), (1.6, 61.6)]),
    "70B": ("70.6B", "8", [(564.8, 624.8), (70.6, 130.6), (23.5, 83.5), (7.1, 67.1)]),
}
SOURCES = ["Hub download, 1 Gb/s", "network volume, 1 GB/s", "local NVMe, 3 GB/s",
           "host page cache, 10 GB/s"]  # fmt: skip


@pytest.mark.parametrize("name", sorted(SEED_004_COLD_STARTS))
def test_size_prints_seed_004_cold_starts_by_weight_source(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    params, bits, expected = SEED_004_COLD_STARTS[name]
    config = _model(tmp_path, LLAMA[name][1])
    argv = [str(config), "--gpu-type", "h100", "--params", params, "--bits", bits]

    assert main(["size", *argv]) == 0
    table = capsys.readouterr().out.splitlines()
    header = f"{'source':<26}  {'model':<14}  {'load s':>7}  {'total cold start s':>18}"
    start = table.index(header)
    rows = table[start + 1 : start + 5]
    for row, source, (load, total) in zip(rows, SOURCES, expected, strict=True):
        assert row == f"{source:<26}  {'test-org/llama':<14}  {load:7.1f}  {total:18.1f}"

    cold = _size_json(capsys, *argv)["cold_start"]
    assert (cold["startup_s"], cold["warmup_s"], cold["arrival_rate"]) == (20, 40, None)
    assert [s["source"] for s in cold["sources"]] == SOURCES
    assert [(round(s["load_s"], 1), round(s["total_s"], 1)) for s in cold["sources"]] == expected
    assert all(s["backlog_requests"] is None for s in cold["sources"])


def test_size_prints_the_backlog_that_piles_up_during_each_cold_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _model(tmp_path, LLAMA["70B"][1])
    argv = [str(config), "--gpu-type", "h100", "--params", "70.6B", "--bits", "8"]
    extra = ["--source", "hub=1Gb/s", "--startup-s", "0", "--warmup-s", "5.2"]
    extra += ["--arrival-rate", "5", "--served-rate", "2"]

    assert main(["size", *argv, *extra]) == 0
    out = capsys.readouterr().out
    # 70.6 GB at 1 Gb/s: 564.8 s, + 5.2 s = 570 s; 3 requests/s beyond the ready replica.
    assert "cold start 570 s:  1710 requests pile up before new capacity arrives" in out
    [source] = _size_json(capsys, *argv, *extra)["cold_start"]["sources"]
    assert source["backlog_requests"] == pytest.approx(1710)
    assert source["bytes_per_second"] == 0.125e9


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--source", "fast", "is not a rate"),
        ("--arrival-rate", "-1", "a number of at least 0"),
        ("--startup-s", "inf", "a number of at least 0"),
    ],
)
def test_size_refuses_bad_cold_start_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str, message: str
) -> None:
    config = _model(tmp_path, LLAMA["8B"][1])
    with pytest.raises(SystemExit) as exit_:
        main(["size", str(config), "--gpu-type", "h100", flag, value])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def _lora_model(tmp_path: Path, loadtime: str, extra: str = "") -> Path:
    """Seed 004's example 15: Llama 3 8B with LoRA adapters declared."""
    model_dir = tmp_path / "model"
    model_dir.mkdir(exist_ok=True)
    shape = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
             "hidden_size": 4096, "intermediate_size": 14336}  # fmt: skip
    shape["torch_dtype"] = "bfloat16"
    (model_dir / "config.json").write_text(json.dumps(shape))
    config = tmp_path / "model.yaml"
    config.write_text(
        "sie_id: test-org/llama\nhf_id: test-org/llama\nmodel_path: model\n"
        "tasks:\n  generate:\n    context_length: 8192\n"
        "profiles:\n  default:\n    compute_precision: bfloat16\n"
        "    adapter_path: sie_server.adapters.sglang.generation:SGLangGenerationAdapter\n"
        f"{extra}    adapter_options:\n      loadtime:\n{loadtime}"
    )
    return config


def test_size_adds_seed_004_multi_lora_memory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 20 teams' rank-16 adapters on one base; SGLang's buffers: 4 slots at rank 64.
    adapters = "".join(f"          team{i}: test-org/team{i}-lora\n" for i in range(20))
    config = _lora_model(
        tmp_path,
        f"        lora_paths:\n{adapters}        max_loras_per_batch: 4\n",
        '    extra_launch_args: ["--max-lora-rank", "64"]\n',
    )
    argv = [str(config), "--gpu-type", "h100", "--params", "8.03e9", "--bits", "16"]
    out = _size_json(capsys, *argv, "--lora-rank", "16")
    lora = out["lora"]
    assert lora["params_per_rank_per_layer"] == 81920
    assert lora["adapter_params"] == 41_943_040
    assert f"{lora['adapter_bytes'] / 1e6:.1f}" == "83.9"
    assert (lora["max_loras_per_batch"], lora["max_rank"]) == (4, 64)
    assert f"{lora['buffer_bytes'] / 1e9:.2f}" == "1.34"
    assert f"{lora['merged_bytes'] / GB:.1f}" == "321.2"
    assert f"{lora['shared_bytes'] / GB:.1f}" == "17.7"
    # The buffers are GPU memory beside the weights.
    assert out["total_bytes"] - lora["buffer_bytes"] == pytest.approx(
        out["weights_bytes"] + out["kv_bytes_total"], abs=2
    )
    assert main(["size", *argv, "--lora-rank", "16"]) == 0
    table = capsys.readouterr().out
    assert "81,920 parameters per rank per layer; 41,943,040 parameters, 83.9 MB" in " ".join(
        table.split()
    )
    assert "1.34 GB of GPU memory for --max-loras-per-batch 4 at rank 64" in " ".join(table.split())
    assert "20 fine-tuned variants: 321.2 GB as merged models, 17.7 GB as one base plus" in (
        " ".join(table.split())
    )
    assert all(len(line) <= 80 for line in table.splitlines())


def test_size_reads_the_rank_from_local_adapters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, rank, modules in (("a", 8, ["q_proj", "v_proj"]), ("b", 32, ["q_proj"])):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "adapter_config.json").write_text(
            json.dumps({"r": rank, "target_modules": modules})
        )
    config = _lora_model(tmp_path, "        lora_paths: {a: ./a, b: ./b}\n")
    lora = _size_json(capsys, str(config), "--gpu-type", "h100", "--params", "8e9")["lora"]
    assert (lora["rank"], lora["modules"], lora["max_loras_per_batch"]) == (
        32, ["q_proj", "v_proj"], 4,
    )  # fmt: skip
    assert lora["params_per_rank_per_layer"] == 8192 + 5120
    assert lora["max_rank"] == 32  # SGLang infers it from the adapters


def _shared_model(
    tmp_path: Path, name: str, sequences: int, *, fraction: float | None = None
) -> Path:
    """A Llama 3.1 8B config (bfloat16) serving ``sequences`` of 8192 tokens."""
    folder = tmp_path / name
    folder.mkdir()
    params, shape = LLAMA["8B"]
    (folder / "config.json").write_text(json.dumps({**shape, "torch_dtype": "bfloat16"}))
    index = {"metadata": {"total_size": int(params * 2)}, "weight_map": {}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    declared = f"        mem_fraction_static: {fraction}\n" if fraction is not None else ""
    config = tmp_path / f"{name}.yaml"
    config.write_text(
        f"sie_id: org/{name}\nhf_id: org/{name}\nmodel_path: {name}\n"
        "tasks:\n  generate:\n    context_length: 8192\n"
        "profiles:\n  default:\n    compute_precision: bfloat16\n"
        f"    kv_budget_tokens: {8192 * sequences}\n"
        "    adapter_path: sie_server.adapters.sglang.generation:SGLangGenerationAdapter\n"
        "    adapter_options:\n      loadtime:\n"
        f"{declared}        startup_timeout_s: 900\n"
    )
    return config


def test_several_models_are_packed_onto_shared_gpus_with_the_fractions_the_worker_passes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = _shared_model(tmp_path, "a", 4)  # 16.1 GB of weights + 4.3 GB of KV cache
    b = _shared_model(tmp_path, "b", 2)
    c = _shared_model(tmp_path, "c", 8, fraction=0.2)
    out = _size_json(capsys, str(a), str(b), str(c), "--gpu-type", "h100")
    assert [m["model"] for m in out["models"]] == ["org/a", "org/b", "org/c"]
    sharing = out["sharing"]
    assert (sharing["gpus_shared"], sharing["gpus_exclusive"]) == (1, 3)
    gpu = sharing["gpus"][0]
    assert [s["model"] for s in gpu] == ["org/a", "org/b", "org/c"]
    assert [s["mem_fraction_static"] for s in gpu] == [0.26, 0.23, 0.2]
    assert [s["mem_fraction_static_suggested"] for s in gpu] == [True, True, False]
    # Each engine's share of what is free when it starts, in that order.
    assert [s["engine_share"] for s in gpu] == [0.26, 0.316, 0.413]
    assert "org/c: mem_fraction_static 0.2 reserves 16.0 GB" in sharing["warnings"][0]
    assert main(["size", str(a), str(b), "--gpu-type", "h100"]) == 0
    table = " ".join(capsys.readouterr().out.split())  # the table wraps at 80 columns
    assert "Sharing GPUs of 80.0 GB (budget 76.0 GB at 95%): 1 GPU(s)" in table
    assert "starts with --mem-fraction-static 0.316" in table


def test_one_model_keeps_its_report_shape(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _size_json(capsys, str(_shared_model(tmp_path, "a", 4)), "--gpu-type", "h100")
    assert out["model"] == "org/a"
    assert "sharing" not in out


def test_size_reads_a_declared_pipeline_as_part_of_the_width(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    params, shape = LLAMA["405B"]
    config = _model(tmp_path, shape, checkpoint_bytes=params * 2, width=8)
    text = config.read_text().replace(
        "        tensor_parallel_size: 8\n",
        "        tensor_parallel_size: 8\n        pipeline_parallel_size: 2\n",
    )
    config.write_text(text)
    out = _size_json(capsys, str(config), "--gpu-type", "h100", "--sequences", "32")
    assert out["declared"]["tensor_parallel_size"] == 8
    assert out["declared"]["pipeline_parallel_size"] == 2
    assert out["warnings"] == []  # 810 GB over 16 GPUs fits; TP=8 alone would not
    assert main(["size", str(config), "--gpu-type", "h100", "--sequences", "32"]) == 0
    table = capsys.readouterr().out
    assert re.search(r"^declared\s+tensor_parallel_size 8, pipeline_parallel_size 2$", table, re.M)
