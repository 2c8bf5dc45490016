"""llama.cpp's command lines for a load (pure): one node on cuda and cpu devices, a group's
leader and follower, the variables it reads as flags, and the layer split ``plan`` shows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.support.tiny_gguf import TINY_GGUF, write_tiny_gguf

from sie_worker.config.files.reader import parse_config
from sie_worker.config.load.loadtime import resolve_load_options
from sie_worker.config.model import ServedModel, served_model
from sie_worker.errors import InvalidConfig
from sie_worker.settings import Settings
from sie_worker.worker.launcher.plan import LaunchPlan, engine_env, plan_launch
from sie_worker.worker.launcher.ranks import group_rank

ADAPTER = "sie_server.adapters.llamacpp.generation:LlamaCppGenerationAdapter"


def _served(folder: Path, loadtime: dict[str, Any] | None = None, **profile: Any) -> ServedModel:
    doc = {
        "sie_id": "org/gguf",
        "model_path": str(folder),
        "tasks": {"generate": {"context_length": 128}},
        "profiles": {
            "default": {
                "adapter_path": ADAPTER,
                "adapter_options": {
                    "loadtime": {"request_read_timeout_s": 60, "startup_timeout_s": 60}
                    | (loadtime or {})
                },
                **profile,
            }
        },
    }
    return served_model(parse_config(doc, source="m.yaml"), "default")


def _plan(served: ServedModel, settings: Settings, *, notes: bool = False) -> LaunchPlan:
    options = resolve_load_options(served, settings, env={})
    group = group_rank(served.id, options.nccl_port, settings) if options.grouped else None
    return plan_launch(
        served,
        options,
        settings.devices[: options.claim_width],
        port=30001,
        nccl_port=None,
        settings=settings,
        group=group,
        notes=notes,
    )


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf")).parent


def _value(argv: tuple[str, ...], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_width_2_on_cuda_splits_by_layer_with_equal_proportions_and_offloads_every_layer(
    folder: Path,
) -> None:
    settings = Settings(devices=("cuda:0", "cuda:1", "cuda:2"), bundle="llamacpp")
    plan = _plan(_served(folder, {"tensor_parallel_size": 2}), settings, notes=True)
    argv = plan.argv
    assert argv[0] == "llama-server"
    assert _value(argv, "-m") == str(folder / "tiny-llama.gguf")
    assert _value(argv, "--alias") == "org/gguf"
    assert _value(argv, "-sm") == "layer"
    assert _value(argv, "-ts") == "1,1"
    assert _value(argv, "-ngl") == "all"
    assert _value(argv, "-c") == "128"
    assert "--metrics" in argv
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "0,1"
    blocks = TINY_GGUF.block_count
    assert plan.summary()["layers"][-1].startswith("output on GPU")
    assert sum(int(r.split("(")[1].rstrip(")")) for r in plan.summary()["layers"][:-1]) == blocks


def test_row_split_and_declared_proportions_are_passed_as_declared(folder: Path) -> None:
    settings = Settings(devices=("cuda:0", "cuda:1"), bundle="llamacpp")
    loadtime = {"tensor_parallel_size": 2, "split_mode": "row", "tensor_split": [3, 1]}
    argv = _plan(_served(folder, loadtime), settings).argv
    assert (_value(argv, "-sm"), _value(argv, "-ts")) == ("row", "3,1")


def test_on_a_cpu_device_it_runs_width_1_on_the_devices_cores(folder: Path) -> None:
    settings = Settings(
        devices=("cpu:0", "cpu:1"), device_cores=((0, 1), (2, 3)), bundle="llamacpp"
    )
    plan = _plan(_served(folder), settings)
    assert _value(plan.argv, "-t") == "2"
    assert _value(plan.argv, "-ngl") == "0"
    assert plan.cores == (0, 1)
    with pytest.raises(InvalidConfig, match="width 1 only"):
        _plan(_served(folder, {"tensor_parallel_size": 2}), settings)


def test_its_flag_variables_are_cleared_from_the_engines_environment(folder: Path) -> None:
    settings = Settings(devices=("cpu",), bundle="llamacpp")
    plan = _plan(_served(folder), settings)
    env = engine_env({"LLAMA_ARG_N_GPU_LAYERS": "9", "LLAMA_API_KEY": "k", "PATH": "/bin"}, plan)
    assert "LLAMA_ARG_N_GPU_LAYERS" not in env
    assert "LLAMA_API_KEY" not in env
    assert env["PATH"] == "/bin"
    assert env["GGML_NO_BACKTRACE"] == "1"


def test_a_groups_follower_runs_the_rpc_server_at_its_address_and_the_leader_names_it(
    folder: Path,
) -> None:
    served = _served(folder, {"tensor_parallel_size": 2, "nccl_port": 50100})
    base = {
        "SIE_DEVICES": "cpu",
        "SIE_BUNDLE": "llamacpp",
        "SIE_NODES": "2",
        "SIE_LEADER_ADDRESS": "10.0.0.1",
        "SIE_NODE_ADDRESSES": "10.0.0.1,10.0.0.2",
        "SIE_PINNED_MODELS": "org/gguf",
        "SIE_LLAMACPP_COMMAND": "/opt/llama/bin/llama-server",
    }
    follower = _plan(served, Settings.from_env({**base, "SIE_NODE_RANK": "1"}, gpu=False))
    assert follower.argv[:5] == ("/opt/llama/bin/ggml-rpc-server", "-H", "10.0.0.2", "-p", "50100")
    assert follower.health_path is None  # ready once started: it serves no HTTP
    leader = _plan(served, Settings.from_env({**base, "SIE_NODE_RANK": "0"}, gpu=False))
    assert _value(leader.argv, "--rpc") == "10.0.0.2:50100"
    assert _value(leader.argv, "-ngl") == "all"
    assert leader.health_path == "/health"


def test_a_folder_of_several_gguf_files_needs_gguf_file(tmp_path: Path) -> None:
    write_tiny_gguf(tmp_path)
    (tmp_path / "other.gguf").write_bytes((tmp_path / "tiny-llama.gguf").read_bytes())
    settings = Settings(devices=("cpu",), bundle="llamacpp")
    with pytest.raises(InvalidConfig, match="gguf_file: is required"):
        _plan(_served(tmp_path), settings)
    plan = _plan(_served(tmp_path, {"gguf_file": "other.gguf"}), settings)
    assert _value(plan.argv, "-m") == str(tmp_path / "other.gguf")


def test_a_hub_model_must_name_its_gguf_file(tmp_path: Path) -> None:
    doc = {
        "sie_id": "org/gguf",
        "hf_id": "org/gguf-repo",
        "tasks": {"generate": {}},
        "profiles": {"default": {"adapter_path": ADAPTER}},
    }
    served = served_model(parse_config(doc, source="m.yaml"), "default")
    with pytest.raises(InvalidConfig, match="gguf_file: is required for a model fetched from"):
        resolve_load_options(served, Settings(devices=("cpu",), bundle="llamacpp"), env={})
