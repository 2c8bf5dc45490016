from __future__ import annotations

from tests.support.sizing_figures import H100, llama_size

from sie_worker.sizing.arithmetic import GB, ModelSize, Shape
from sie_worker.sizing.config_warnings import config_warnings


def test_no_warning_for_a_width_that_holds_weights_and_budget() -> None:
    warnings = config_warnings(
        llama_size("70B", 16), width=4, kv_budget_tokens=32768, context_tokens=8192, hardware=H100
    )
    assert warnings == []


def test_warns_when_declared_width_cannot_hold_the_weights() -> None:
    warnings = config_warnings(
        llama_size("70B", 16), width=1, kv_budget_tokens=None, context_tokens=None, hardware=H100
    )
    assert len(warnings) == 1
    assert warnings[0].path == "$.profiles.default.adapter_options.loadtime.tensor_parallel_size"
    assert "tensor_parallel_size 1 cannot hold the weights" in warnings[0].message
    assert "141.2 GB per GPU" in warnings[0].message
    assert "width 2 is the smallest that does" in warnings[0].message


def test_weights_warning_mentions_a_server_with_too_few_devices() -> None:
    warnings = config_warnings(
        llama_size("70B", 16),
        width=1,
        kv_budget_tokens=None,
        context_tokens=None,
        hardware=H100,
        devices=1,
    )
    assert "this server has 1 GPU" in warnings[0].message


def test_warns_when_kv_budget_does_not_fit_beside_the_weights() -> None:
    # 70B BF16 on 2 x 80 GB: 70.6 GB of weights per GPU leaves 1.4 GB, about 8,900 tokens.
    warnings = config_warnings(
        llama_size("70B", 16),
        width=2,
        kv_budget_tokens=262144,
        context_tokens=8192,
        hardware=H100,
        profile="long",
    )
    assert [w.path for w in warnings] == ["$.profiles.long.kv_budget_tokens"]
    assert "kv_budget_tokens 262144 does not fit beside the weights" in warnings[0].message
    assert "width 4 is the smallest that does" in warnings[0].message


def test_warns_when_a_model_that_fits_one_gpu_is_split() -> None:
    warnings = config_warnings(
        llama_size("8B", 16), width=2, kv_budget_tokens=32768, context_tokens=8192, hardware=H100
    )
    assert len(warnings) == 1
    assert "fits one GPU" in warnings[0].message
    assert "tensor_parallel_size is 2" in warnings[0].message
    assert "replica" in warnings[0].message


def test_split_warning_counts_the_kv_budget_when_deciding_one_gpu_fits() -> None:
    # 16.1 GB of weights + 400k tokens x 128 KiB = 68.6 GB: fits 72 GB; 500k tokens does not.
    model = llama_size("8B", 16)
    fits = config_warnings(
        model, width=2, kv_budget_tokens=400_000, context_tokens=None, hardware=H100
    )
    split_needed = config_warnings(
        model, width=2, kv_budget_tokens=500_000, context_tokens=None, hardware=H100
    )
    assert any("fits one GPU" in w.message for w in fits)
    assert split_needed == []


def test_weights_warning_suggests_a_width_that_also_holds_the_declared_budget() -> None:
    warnings = config_warnings(
        llama_size("70B", 16), width=1, kv_budget_tokens=262144, context_tokens=8192, hardware=H100
    )
    assert len(warnings) == 1
    assert "with kv_budget_tokens 262144, width 4 is the smallest that does" in warnings[0].message


def test_pipeline_stages_share_the_weights_of_a_declared_group() -> None:
    # 405B BF16 (810 GB): TP=8 alone holds 101 GB per GPU; x PP=2 across nodes, 50.6 GB.
    model = llama_size("405B", 16)
    alone = config_warnings(
        model, width=8, kv_budget_tokens=None, context_tokens=8192, hardware=H100
    )
    assert "tensor_parallel_size 8 cannot hold the weights" in alone[0].message
    group = config_warnings(
        model, width=8, stages=2, kv_budget_tokens=262144, context_tokens=8192, hardware=H100
    )
    assert group == []


def test_a_split_warning_names_both_sizes_of_a_pipelined_model() -> None:
    [warning] = config_warnings(
        llama_size("8B", 16),
        width=1,
        stages=2,
        kv_budget_tokens=None,
        context_tokens=8192,
        hardware=H100,
    )
    assert "but tensor_parallel_size 1 x pipeline_parallel_size 2: split only" in warning.message


def test_weights_warning_names_the_smallest_split_when_no_tensor_width_alone_holds_them() -> None:
    # 14 heads and 2 KV heads allow tensor widths 1 and 2 only: 250 GB needs TP=2 x PP=2.
    shape = Shape(layers=40, attention_heads=14, kv_heads=2, head_dim=128)
    warnings = config_warnings(
        ModelSize(shape, 250 * GB),
        width=1,
        kv_budget_tokens=None,
        context_tokens=None,
        hardware=H100,
        devices=2,
    )
    assert len(warnings) == 1
    assert (
        "no tensor width alone does; tensor_parallel_size 2 x pipeline_parallel_size 2 is the "
        "smallest split that does (this server has 2 GPUs)"
    ) in warnings[0].message
