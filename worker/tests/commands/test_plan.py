"""``sie-worker plan``: the argv and env a load would use, or the refusal."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.support import sglang_parser

from sie_worker.cli import main
from sie_worker.worker.launcher.ports import ENGINE_PORTS, RENDEZVOUS_PORTS

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "values-examples" / "models"
SEED = EXAMPLES / "my-large-model.yaml"
QWEN = EXAMPLES / "qwen2.5-32b-instruct.yaml"
FOUR = "cuda:0,cuda:1,cuda:2,cuda:3"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for key in list(os.environ):
        if key.startswith("SIE_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))


def plan(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["plan", *args]) == 0
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    return result


def test_seed_example_on_four_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    result = plan(capsys, str(SEED), "--devices", FOUR)
    assert list(result) == ["model", "width", "devices", "argv", "env", "memory_bytes"]
    assert result["memory_bytes"] is None  # no NVML here, no budget: memory unknown
    assert result["model"] == "my-org/my-large-model"
    assert result["width"] == 4
    assert result["devices"] == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    assert result["env"] == {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    argv = result["argv"]
    assert argv[:3] == [sys.executable, "-m", "sglang.launch_server"]
    assert argv[argv.index("--tp-size") + 1] == "4"
    assert int(argv[argv.index("--port") + 1]) in ENGINE_PORTS
    assert int(argv[argv.index("--nccl-port") + 1]) in RENDEZVOUS_PORTS
    assert argv[-1] == "--disable-prefill-cuda-graph"


def test_with_a_memory_budget_the_plan_shows_the_need_and_the_engines_share(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SIE_FAKE_MEMORY_BUDGET", "80GiB")
    result = plan(capsys, str(SEED), "--devices", FOUR)
    # Undeclared mem_fraction_static: SIE's 0.85 of 80 GiB, plus 1 GiB, on each device.
    assert result["memory_bytes"] == int(0.85 * 80 * 2**30) + 2**30
    argv = result["argv"]
    assert argv[argv.index("--mem-fraction-static") + 1] == "0.85"


def test_the_default_engine_plans_its_weights_need_and_its_cuda_cap(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SIE_FAKE_MEMORY_BUDGET", "24GiB")
    minilm = EXAMPLES / "all-minilm-l6-v2.yaml"
    on_cpu = plan(capsys, str(minilm), "--devices", "cpu")
    on_gpu = plan(capsys, str(minilm), "--devices", "cuda:0")
    # Its weights x 1.2 + 1 GiB, and 0.5 GiB more on cpu.
    assert on_cpu["memory_bytes"] - on_gpu["memory_bytes"] == 2**29
    assert 2**30 < on_gpu["memory_bytes"] < 2**30 + 200 * 2**20
    assert "--cuda-memory-fraction" not in on_cpu["argv"]
    cap = float(on_gpu["argv"][on_gpu["argv"].index("--cuda-memory-fraction") + 1])
    assert cap == int(on_gpu["memory_bytes"] / (24 * 2**30) * 1000) / 1000


def test_model_goes_on_the_first_block(capsys: pytest.CaptureFixture[str]) -> None:
    result = plan(capsys, str(QWEN), "--devices", "cuda:4,cuda:5,cuda:6,cuda:7")
    assert result["devices"] == ["cuda:4", "cuda:5"]
    assert result["env"]["CUDA_VISIBLE_DEVICES"] == "4,5"


def test_profile_option_plans_that_served_model(capsys: pytest.CaptureFixture[str]) -> None:
    result = plan(capsys, str(QWEN), "--devices", FOUR, "--profile", "long-context")
    assert result["model"] == "Qwen/Qwen2.5-32B-Instruct:long-context"
    assert result["width"] == 4
    assert result["env"] == {"NCCL_DEBUG": "WARN", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    argv = result["argv"]
    assert argv[argv.index("--nccl-port") + 1] == "31000"


def test_sie_devices_is_used_without_devices(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SIE_DEVICES", FOUR)
    assert plan(capsys, str(SEED))["width"] == 4


def test_bundle_spelling_follows_the_bundle_release_and_sie_sglang_version_overrides_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The bundle's release decides (plan shows what that bundle's image runs), not the
    # SGLang installed where plan runs (0.5.23 in the venv).
    monkeypatch.setenv("SIE_BUNDLE", "sglang")
    assert (
        plan(capsys, str(SEED), "--devices", FOUR)["argv"][-1] == "--disable-piecewise-cuda-graph"
    )
    monkeypatch.setenv("SIE_BUNDLE", "sglang-cu130")
    assert plan(capsys, str(SEED), "--devices", FOUR)["argv"][-1] == "--disable-prefill-cuda-graph"
    monkeypatch.setenv("SIE_BUNDLE", "sglang")
    monkeypatch.setenv("SIE_SGLANG_VERSION", "0.5.20")
    assert plan(capsys, str(SEED), "--devices", FOUR)["argv"][-1] == "--disable-prefill-cuda-graph"


def test_refused_load_exits_1_with_the_refusal(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(SEED), "--devices", "cuda:0,cuda:1"]) == 1
    [line] = capsys.readouterr().out.splitlines()
    assert line.startswith(
        f"{SEED}: $.profiles.default.adapter_options.loadtime.tensor_parallel_size: 4 needs 4 GPUs"
    )


def test_without_devices_one_device_refuses_width_4(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(SEED)]) == 1
    assert "this worker has 1 device(s)" in capsys.readouterr().out


def test_unknown_profile_exits_1_naming_the_profiles(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(QWEN), "--devices", FOUR, "--profile", "fast"]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"{QWEN}: $.profiles: ")
    assert "profiles: default, long-context, structured" in out


def test_invalid_file_exits_1_with_every_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(SEED.read_text() + '    extra_launch_args: ["--tp=2", "--host", "x"]\n')
    assert main(["plan", str(path), "--devices", FOUR]) == 1
    assert len(capsys.readouterr().out.splitlines()) == 2


def test_transformers_model_plans_the_default_engine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(
        "sie_id: minilm\nhf_id: sentence-transformers/all-MiniLM-L6-v2\n"
        "tasks: {encode: {max_sequence_length: 256}}\nprofiles: {default: {}}\n"
    )
    result = plan(capsys, str(path), "--devices", "cpu")
    assert result["argv"][1:3] == ["-m", "sie_worker.engines.transformers"]
    assert "--nccl-port" not in result["argv"]
    assert result["env"] == {"CUDA_VISIBLE_DEVICES": ""}


@pytest.mark.slow  # imports SGLang's parser in a fresh interpreter
@pytest.mark.torch
@pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="sglang is not installed")
def test_printed_argv_is_accepted_by_sglangs_parser() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIE_")}
    done = subprocess.run(
        [sys.executable, "-m", "sie_worker", "plan", str(SEED), "--devices", FOUR],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        env=env,
    )
    argv = json.loads(done.stdout)["argv"]
    [result] = sglang_parser.parse({"argvs": [argv[3:]], "server_args": True})["argvs"]
    assert result["ok"], result["error"]
    assert (result["values"]["tp_size"], result["values"]["model_path"]) == (
        4,
        "my-org/my-large-model",
    )


def test_plan_warns_about_options_not_applied_and_bundles_that_do_not_serve_the_adapter(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "gemma.yaml"
    path.write_text(
        "sie_id: google/gemma-4-E2B-it\nhf_id: google/gemma-4-E2B-it\n"
        "tasks: {generate: {context_length: 8192, max_output_tokens: 1024}}\n"
        "profiles:\n  default:\n"
        "    adapter_path: sie_server.adapters.sglang.gemma:SGLangGemmaAdapter\n"
        "    adapter_options:\n      loadtime: {reasoning_parser: gemma4, thinking_budget: 512}\n"
    )
    plan(capsys, str(path), "--devices", "cuda:0")  # SIE_BUNDLE unset: the default bundle
    monkeypatch.setenv("SIE_BUNDLE", "sglang-cu130")
    assert main(["plan", str(path), "--devices", "cuda:0"]) == 0
    err = capsys.readouterr().err
    assert "thinking_budget: accepted but not applied by this worker" in err
    assert "is served by the sglang-cu130 bundle" not in err
    monkeypatch.delenv("SIE_BUNDLE")
    assert main(["plan", str(path), "--devices", "cuda:0"]) == 0
    err = capsys.readouterr().err
    assert (
        f"warning: {path}: SGLangGemmaAdapter is served by the sglang-cu130 bundle; this plan "
        "is for SIE_BUNDLE=default with SGLang 0.5.23's flags"
    ) in err


def test_an_sie_adapter_this_image_does_not_run_is_refused_naming_its_bundle(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "gliner.yaml"
    path.write_text(
        "sie_id: urchade/gliner_multi-v2.1\nhf_id: urchade/gliner_multi-v2.1\n"
        "tasks: {extract: {}}\n"
        "profiles:\n  default:\n    adapter_path: sie_server.adapters.gliner:GLiNERAdapter\n"
    )
    assert main(["validate", str(path)]) == 0
    capsys.readouterr()
    assert main(["plan", str(path)]) == 1
    [line] = capsys.readouterr().out.splitlines()
    assert line == (
        f"{path}: $.profiles.default.adapter_path: sie_server.adapters.gliner:GLiNERAdapter is an "
        "adapter of SIE 0.10.1 that this image does not run (this image's bundles: default, "
        "llamacpp, sglang, sglang-cu130, vllm); SIE serves it with the default bundle of its own "
        "server image (sie-server)"
    )


def test_a_model_complete_in_the_cache_is_planned_from_its_snapshot(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from sie_worker.worker.weights.cache import mark_complete

    commit = "c" * 40
    repo = tmp_path / "hub" / "models--my-org--my-large-model"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text('{"num_attention_heads": 8, "num_key_value_heads": 8}')
    (snapshot / "model.safetensors").write_bytes(b"w" * 10)
    mark_complete(_key(), repo, commit, {"config.json": None, "model.safetensors": 10})

    argv = plan(capsys, str(SEED), "--devices", FOUR)["argv"]

    assert argv[argv.index("--model-path") + 1] == str(snapshot)
    assert "--revision" not in argv
    assert capsys.readouterr().err == ""


def test_a_model_missing_from_the_cache_is_planned_with_its_hub_id_and_a_note(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["plan", str(SEED), "--devices", FOUR]) == 0
    captured = capsys.readouterr()
    argv = json.loads(captured.out)["argv"]
    assert argv[argv.index("--model-path") + 1] == "my-org/my-large-model"
    assert "a load downloads it first" in captured.err
    assert f"sie-worker fetch {SEED}" in captured.err


def _key() -> Any:
    from sie_worker.worker.weights.cache import SnapshotKey

    return SnapshotKey("my-org/my-large-model")


def test_a_llamacpp_model_is_planned_from_the_snapshot_complete_for_its_gguf_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from sie_worker.worker.weights.cache import SnapshotKey, mark_complete

    config = tmp_path / "gguf.yaml"
    config.write_text(
        "sie_id: org/tiny-q8\nhf_id: org/tiny-GGUF\n"
        "tasks: {generate: {context_length: 256, max_output_tokens: 16}}\n"
        "profiles:\n  default:\n"
        "    adapter_path: sie_server.adapters.llamacpp.generation:LlamaCppGenerationAdapter\n"
        "    adapter_options: {loadtime: {gguf_file: tiny-Q8_0.gguf}}\n"
    )
    commit = "d" * 40
    repo = tmp_path / "hub" / "models--org--tiny-GGUF"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "tiny-Q4_K_M.gguf").write_bytes(b"GGUF4")
    q4 = SnapshotKey("org/tiny-GGUF", weights=("tiny-Q4_K_M.gguf",))
    mark_complete(q4, repo, commit, {"tiny-Q4_K_M.gguf": 5})
    # Complete for the other file only: the load would download, and the plan says so.
    assert main(["plan", str(config), "--devices", "cpu:0"]) == 0
    assert "org/tiny-GGUF@main [tiny-Q8_0.gguf] is not complete" in capsys.readouterr().err

    (snapshot / "tiny-Q8_0.gguf").write_bytes(b"GGUF8")
    q8 = SnapshotKey("org/tiny-GGUF", weights=("tiny-Q8_0.gguf",))
    mark_complete(q8, repo, commit, {"tiny-Q8_0.gguf": 5})
    argv = plan(capsys, str(config), "--devices", "cpu:0")["argv"]
    assert argv[argv.index("-m") + 1] == str(snapshot / "tiny-Q8_0.gguf")
