"""The llama.cpp adapter's declaration and its load-time options: what each accepts, and the
placement flags a block of devices gets."""

from __future__ import annotations

from typing import Any

import pytest

from sie_server.adapters.llamacpp.generation import LlamaCppGenerationAdapter
from sie_worker.config.flags.option_rules import Release
from sie_worker.engines.llamacpp.options import (
    LLAMACPP_OPTIONS,
    option_problem,
    split_args,
    split_problem,
)

NO_TABLE = Release("0c1e57098", "llamacpp", None, label="llama.cpp")


def test_the_adapter_serves_generate_from_the_llamacpp_bundle() -> None:
    adapter = LlamaCppGenerationAdapter
    assert adapter.engine == "llamacpp"
    assert adapter.bundle == "llamacpp"
    assert adapter.task({"generate": {}}) == "generate"
    assert adapter.adapter_path() == (
        "sie_server.adapters.llamacpp.generation:LlamaCppGenerationAdapter"
    )
    assert adapter.engine_args({}) == ()


def test_the_adapter_accepts_the_split_and_file_options_and_none_of_the_gpu_engines() -> None:
    accepted = set(LlamaCppGenerationAdapter.loadtime_options)
    assert {
        "gguf_file",
        "tensor_split",
        "split_mode",
        "tensor_parallel_size",
        "request_read_timeout_s",
        "startup_timeout_s",
        "max_seq_length",
    } <= accepted
    assert accepted.isdisjoint(
        {"gpu_memory_utilization", "mem_fraction_static", "compute_precision", "lora_paths"}
    )
    assert LlamaCppGenerationAdapter.loadtime_options == tuple(LLAMACPP_OPTIONS)


@pytest.mark.parametrize(
    "value",
    ["model-Q4_K_M.gguf", "sub/dir/model.GGUF", "big-00001-of-00003.gguf"],
)
def test_gguf_file_accepts_a_gguf_path_inside_the_folder(value: str) -> None:
    assert option_problem("gguf_file", value, NO_TABLE) is None


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("", "must be the path of a .gguf file"),
        (3, "got an integer 3"),
        ("/abs/model.gguf", "relative, without .."),
        ("../model.gguf", "relative, without .."),
        ("model.safetensors", "ends in .gguf"),
        ("big-00002-of-00003.gguf", "name its first part, big-00001-of-00003.gguf"),
    ],
)
def test_gguf_file_refuses_what_is_not_a_gguf_path_inside_the_folder(
    value: object, fragment: str
) -> None:
    problem = option_problem("gguf_file", value, NO_TABLE)
    assert problem is not None
    assert fragment in problem


@pytest.mark.parametrize("value", [[1], [3, 1], [0.5, 0.25, 0.25, 0]])
def test_tensor_split_accepts_proportions(value: list[float]) -> None:
    assert option_problem("tensor_split", value, NO_TABLE) is None


@pytest.mark.parametrize(
    "value", [[], [0, 0], [1, -1], [1, True], "3,1", [1] * 9, [float("inf")], {"a": 1}]
)
def test_tensor_split_refuses_what_is_not_a_list_of_proportions(value: object) -> None:
    problem = option_problem("tensor_split", value, NO_TABLE)
    assert problem is not None
    assert "proportions" in problem


def test_split_mode_is_layer_or_row_and_says_why_not_none_or_tensor() -> None:
    assert option_problem("split_mode", "layer", NO_TABLE) is None
    assert option_problem("split_mode", "row", NO_TABLE) is None
    none = option_problem("split_mode", "none", NO_TABLE)
    assert none is not None
    assert "width 1 runs -sm none" in none
    tensor = option_problem("split_mode", "tensor", NO_TABLE)
    assert tensor is not None
    assert "experimental" in tensor


@pytest.mark.parametrize(
    ("loadtime", "width", "kind", "problem"),
    [
        ({}, 1, "cpu", None),
        ({}, 4, "cuda", None),
        ({"tensor_split": [3, 1]}, 2, "cuda", None),
        ({"tensor_split": [3, 1]}, 4, "cuda", "tensor_split has 2 proportions"),
        ({}, 2, "cpu", "width 1 only"),
    ],
)
def test_the_split_must_fit_the_block(
    loadtime: dict[str, Any], width: int, kind: str, problem: str | None
) -> None:
    found = split_problem(loadtime, width, kind)
    if problem is None:
        assert found is None
    else:
        assert found is not None
        assert problem in found


def test_one_device_runs_split_mode_none_and_a_block_splits_layers_equally() -> None:
    assert split_args(1) == ("-sm", "none", "-ngl", "all")
    assert split_args(1, device_kind="cpu") == ("-sm", "none", "-ngl", "0")
    assert split_args(4) == ("-sm", "layer", "-ts", "1,1,1,1", "-ngl", "all")


def test_a_block_takes_the_declared_proportions_and_split_mode() -> None:
    assert split_args(2, [3, 1.5], "row") == ("-sm", "row", "-ts", "3,1.5", "-ngl", "all")
