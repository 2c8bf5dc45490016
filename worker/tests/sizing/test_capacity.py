from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from sie_worker.config.files.reader import load_config_file
from sie_worker.config.model import ServedModel, served_model
from sie_worker.sizing.arithmetic import Hardware
from sie_worker.sizing.capacity import (
    add_gpu_arguments,
    gpu_from,
    hardware_from_args,
    kv_bytes_per_value,
    served_model_warnings,
    workload_for,
)
from sie_worker.sizing.gpus import GpuError

LLAMA_70B = {
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "hidden_size": 8192,
    "torch_dtype": "bfloat16",
}
H100 = Hardware(80e9)


def _served(
    tmp_path: Path,
    *,
    width: int = 1,
    extra: str = "",
    profile_extra: str = "",
    weights_bytes: float | None = 141.2e9,
    profile: str = "default",
) -> ServedModel:
    model_dir = tmp_path / "model"
    model_dir.mkdir(exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(LLAMA_70B))
    if weights_bytes is not None:
        index = {"metadata": {"total_size": int(weights_bytes)}, "weight_map": {}}
        (model_dir / "model.safetensors.index.json").write_text(json.dumps(index))
    path = tmp_path / "model.yaml"
    path.write_text(
        "sie_id: org/m\nhf_id: org/m\nmodel_path: model\n"
        "tasks:\n  generate:\n    context_length: 8192\n"
        "profiles:\n  default:\n    compute_precision: bfloat16\n"
        f"{extra}"
        "    adapter_path: sie_server.adapters.sglang.generation:SGLangGenerationAdapter\n"
        "    adapter_options:\n      loadtime:\n"
        f"        tensor_parallel_size: {width}\n"
        "        request_read_timeout_s: 600\n        startup_timeout_s: 900\n"
        f"{profile_extra}"
    )
    return served_model(load_config_file(path), profile)


def test_served_model_warnings_name_the_config_file_and_width(tmp_path: Path) -> None:
    served = _served(tmp_path, width=1)
    problems = served_model_warnings(served, H100, devices=1)
    assert len(problems) == 1
    assert problems[0].file == str(tmp_path / "model.yaml")
    assert problems[0].path == "$.profiles.default.adapter_options.loadtime.tensor_parallel_size"
    assert "this server has 1 GPU" in problems[0].message


def test_inherited_width_is_reported_at_the_profile_that_declares_it(tmp_path: Path) -> None:
    profile = "  structured:\n    extends: default\n"
    served = _served(tmp_path, width=1, profile_extra=profile, profile="structured")
    problems = served_model_warnings(served, H100)
    assert [p.path for p in problems] == [
        "$.profiles.default.adapter_options.loadtime.tensor_parallel_size"
    ]


def test_no_warnings_without_a_weights_figure(tmp_path: Path) -> None:
    # No safetensors files or index: like the head check, nothing to check.
    served = _served(tmp_path, width=1, weights_bytes=None)
    assert served_model_warnings(served, H100) == []


def test_no_warnings_for_a_width_that_fits(tmp_path: Path) -> None:
    assert served_model_warnings(_served(tmp_path, width=4), H100) == []


def test_kv_cache_dtype_in_launch_args_sets_bytes_per_value(tmp_path: Path) -> None:
    served = _served(tmp_path, extra='    extra_launch_args: ["--kv-cache-dtype", "fp8_e5m2"]\n')
    assert kv_bytes_per_value(served) == (1.0, "--kv-cache-dtype fp8_e5m2")
    abbreviated = _served(tmp_path, extra='    extra_launch_args: ["--kv-cache-d=fp8_e4m3"]\n')
    assert kv_bytes_per_value(abbreviated)[0] == 1.0


def test_kv_bytes_default_to_the_compute_precision(tmp_path: Path) -> None:
    assert kv_bytes_per_value(_served(tmp_path)) == (2.0, "compute_precision bfloat16")


def test_workload_sequences_follow_kv_budget(tmp_path: Path) -> None:
    served = _served(tmp_path, extra="    kv_budget_tokens: 100000\n")
    choice = workload_for(served, None)
    assert (choice.workload.context_tokens, choice.workload.sequences) == (8192, 12)
    assert workload_for(served, None, context=1000, sequences=3).workload.sequences == 3


def test_gpu_type_env_names_itself_when_unknown() -> None:
    with pytest.raises(GpuError, match="SIE_GPU_TYPE: unknown GPU type 'x100'"):
        gpu_from(None, None, {"SIE_GPU_TYPE": "x100"})


def test_no_gpu_named_gives_no_hardware() -> None:
    parser = argparse.ArgumentParser()
    add_gpu_arguments(parser)
    assert hardware_from_args(parser.parse_args([]), {}) is None
    hardware = hardware_from_args(parser.parse_args(["--gpu-type", "l4", "--usable", "0.8"]), {})
    assert hardware == Hardware(24e9, 0.8, 8)


def test_gpu_type_and_memory_are_exclusive() -> None:
    parser = argparse.ArgumentParser()
    add_gpu_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--gpu-type", "l4", "--gpu-memory", "24GB"])


@pytest.mark.parametrize("usable", ["0", "1.5", "most"])
def test_usable_fraction_is_checked(usable: str) -> None:
    parser = argparse.ArgumentParser()
    add_gpu_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--usable", usable])
