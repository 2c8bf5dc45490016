from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.support.sizing_figures import LLAMA, SEED_004_TABLE

from sie_worker.config.rules import MAX_WIDTH, valid_widths
from sie_worker.sizing.model_stats import shape_from_config
from sie_worker.sizing.plan import (
    Hardware,
    ModelSize,
    Shape,
    Workload,
    choose_width,
    config_warnings,
    is_power_of_two,
    kv_bytes_per_token,
    kv_bytes_per_token_per_gpu,
    max_concurrency,
    minimum_gpus,
    plan,
    plan_weights_only,
    suggest_pool,
    usable_bytes,
    weights_bytes,
)

GB = 1e9

H100 = Hardware(gpu_memory_bytes=80e9, usable=0.9, gpus_per_node=8)
SEED_004_USERS = Workload(context_tokens=8192, sequences=32)


def _llama(name: str, bits: float) -> ModelSize:
    params, config = LLAMA[name]
    return ModelSize(shape_from_config(config), weights_bytes(params, bits))


@pytest.mark.parametrize(("name", "bits", "weights", "kv", "total", "gpus"), SEED_004_TABLE)
def test_plan_reproduces_seed_004_why_split_table(
    name: str, bits: float, weights: float, kv: float, total: float, gpus: int
) -> None:
    result = plan(_llama(name, bits), SEED_004_USERS, H100)
    assert round(result.weights_bytes / GB, 1) == weights
    assert result.kv_bytes_total is not None
    assert round(result.kv_bytes_total / GB, 1) == kv
    assert round(result.total_bytes / GB, 1) == total
    assert result.min_gpus == gpus


@pytest.mark.parametrize(("name", "kib"), [("8B", 128), ("70B", 320), ("405B", 504)])
def test_kv_per_token_matches_seed_004(name: str, kib: int) -> None:
    assert kv_bytes_per_token(_llama(name, 16).shape) / 1024 == kib


def test_head_dim_comes_from_hidden_size_over_heads_when_absent() -> None:
    assert shape_from_config(LLAMA["70B"][1]).head_dim == 128


@pytest.mark.parametrize(
    ("name", "bits", "width"),
    [("8B", 16, 1), ("70B", 16, 4), ("70B", 8, 4), ("70B", 4.5, 2), ("405B", 8, 8)],
)
def test_width_is_smallest_power_of_two_at_or_above_the_minimum(
    name: str, bits: float, width: int
) -> None:
    result = plan(_llama(name, bits), SEED_004_USERS, H100)
    assert result.width.width == width
    assert result.width.width >= result.min_gpus


def test_seed_004_70b_at_8_bits_explains_why_3_is_not_used() -> None:
    reason = plan(_llama("70B", 8), SEED_004_USERS, H100).width.reason
    assert "needs 3 GPUs" in reason
    assert "width 3 does not suit the 64 attention heads" in reason


def test_405b_bf16_needs_more_gpus_than_one_engine_spans() -> None:
    result = plan(_llama("405B", 16), SEED_004_USERS, H100)
    assert result.width.width is None
    assert "needs 14 GPUs" in result.width.reason
    assert "--bits" in result.width.reason
    assert result.pool is None
    assert result.concurrency_per_replica is None


# Seed 001, gpus_needed.py: need = weights x 1.4 (KV reserve), 90% of an 80 GB card usable.
@pytest.mark.parametrize(
    ("model_gb", "need_gb", "raw", "tp"), [(140, 196.0, 3, 4), (40, 56.0, 1, 1)]
)
def test_minimum_gpus_and_width_reproduce_seed_001_gpus_needed(
    model_gb: float, need_gb: float, raw: int, tp: int
) -> None:
    need = model_gb * GB * 1.4
    assert round(need / GB, 1) == need_gb
    assert round(usable_bytes(80e9, 0.9) / GB, 1) == 72.0
    assert minimum_gpus(need, 80e9, 0.9) == raw
    llama_70b = shape_from_config(LLAMA["70B"][1])
    assert choose_width(raw, llama_70b).width == tp


def test_seed_001_kv_capacity_per_request_and_concurrency() -> None:
    shape = shape_from_config(LLAMA["70B"][1])
    at_8k = kv_bytes_per_token(shape) * 8192
    at_4k = kv_bytes_per_token(shape) * 4096
    assert round(at_8k / GB, 2) == 2.68
    assert max_concurrency(116 * GB, at_8k) == 43
    assert max_concurrency(116 * GB, at_4k) == 86


def test_minimum_gpus_does_not_round_up_an_exact_fit() -> None:
    assert minimum_gpus(144e9, 80e9, 0.9) == 2
    assert minimum_gpus(144e9 + 1e6, 80e9, 0.9) == 3


def test_fourteen_heads_never_get_width_4() -> None:
    # Qwen2.5-0.5B: 14 attention heads, 2 KV heads.
    shape = Shape(layers=24, attention_heads=14, kv_heads=2, head_dim=64)
    assert valid_widths(14, 2) == (1, 2)
    assert choose_width(2, shape).width == 2
    for minimum in (3, 4):
        choice = choose_width(minimum, shape)
        assert choice.width is None
        assert "14 attention heads" in choice.reason
        assert "valid widths: 1, 2" in choice.reason


def test_power_of_two_preferred_over_a_smaller_valid_width_and_reason_says_why() -> None:
    shape = Shape(layers=40, attention_heads=24, kv_heads=24, head_dim=128)
    assert 3 in valid_widths(24, 24)
    choice = choose_width(3, shape, gpus_per_node=8)
    assert choice.width == 4
    assert "preferred over 3" in choice.reason
    assert "leaves 2 idle" in choice.reason


def test_non_power_of_two_width_when_no_power_of_two_suits_the_heads() -> None:
    shape = Shape(layers=40, attention_heads=12, kv_heads=12, head_dim=128)
    choice = choose_width(5, shape)
    assert choice.width == 6
    assert "no power of two" in choice.reason


@given(
    heads=st.integers(1, 256),
    kv_divisor=st.integers(1, 64),
    minimum=st.integers(1, MAX_WIDTH),
)
def test_chosen_width_obeys_the_head_rules_and_prefers_powers_of_two(
    heads: int, kv_divisor: int, minimum: int
) -> None:
    kv = max(1, heads // kv_divisor) if heads % kv_divisor == 0 else heads
    shape = Shape(layers=1, attention_heads=heads, kv_heads=kv, head_dim=1)
    choice = choose_width(minimum, shape)
    candidates = [w for w in valid_widths(heads, kv) if w >= minimum]
    if not candidates:
        assert choice.width is None
        return
    assert choice.width is not None
    assert choice.width >= minimum
    assert heads % choice.width == 0
    assert kv % choice.width == 0 or choice.width % kv == 0
    powers = [w for w in candidates if is_power_of_two(w)]
    assert choice.width == (powers[0] if powers else candidates[0])


def test_kv_heads_are_copied_when_fewer_than_the_width() -> None:
    shape = Shape(layers=2, attention_heads=16, kv_heads=2, head_dim=64)
    whole = kv_bytes_per_token(shape)
    assert kv_bytes_per_token_per_gpu(shape, 2) == whole / 2
    # Width 4 over 2 KV heads: each GPU keeps one whole head, not half of one.
    assert kv_bytes_per_token_per_gpu(shape, 4) == whole / 2


def test_latent_attention_stores_one_latent_per_layer_on_every_rank() -> None:
    config = {
        "num_hidden_layers": 61,
        "num_attention_heads": 128,
        "num_key_value_heads": 128,
        "hidden_size": 7168,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
    }
    shape = shape_from_config(config)
    assert kv_bytes_per_token(shape) == 61 * 576 * 2
    assert kv_bytes_per_token_per_gpu(shape, 8) == kv_bytes_per_token(shape)


def test_replica_budget_and_concurrency_follow_the_weights_left_per_gpu() -> None:
    result = plan(_llama("70B", 16), SEED_004_USERS, H100)
    assert result.weights_bytes_per_gpu == pytest.approx(141.2e9 / 4)
    assert result.kv_budget_bytes_per_replica == pytest.approx(4 * 72e9 - 141.2e9)
    per_token = kv_bytes_per_token(_llama("70B", 16).shape)
    assert result.kv_budget_tokens_per_replica == int((4 * 72e9 - 141.2e9) // per_token)
    assert result.concurrency_per_replica == int((4 * 72e9 - 141.2e9) // (per_token * 8192))
    assert result.concurrency_per_replica >= SEED_004_USERS.sequences
    assert result.replicas_per_node == 2


def test_pool_for_a_split_model_is_a_device_group_scaled_per_gpu() -> None:
    pool = suggest_pool(4, 20e9)
    assert (pool.gpu_count, pool.device_group) == (4, True)
    # Seed 000's l4-4x pool: shmSize 32Gi, memory 64Gi request / 128Gi limit.
    assert (pool.shm_size_gib, pool.memory_request_gib, pool.memory_limit_gib) == (32, 64, 128)


def test_pool_memory_limit_holds_the_checkpoint_and_shm() -> None:
    pool = suggest_pool(4, 141.2e9)
    assert pool.memory_limit_gib >= 141.2e9 / 2**30 + pool.shm_size_gib
    assert pool.memory_request_gib <= pool.memory_limit_gib


def test_pool_for_a_one_gpu_model_is_not_a_device_group() -> None:
    pool = suggest_pool(1, 16e9)
    assert (pool.gpu_count, pool.device_group, pool.shm_size_gib) == (1, False, 8)


def test_max_concurrency_refuses_an_empty_sequence() -> None:
    with pytest.raises(ValueError, match="kv_bytes_per_sequence"):
        max_concurrency(1e9, 0)


# Warnings for a declared config (issue 12, item 3).


def test_no_warning_for_a_width_that_holds_weights_and_budget() -> None:
    warnings = config_warnings(
        _llama("70B", 16), width=4, kv_budget_tokens=32768, context_tokens=8192, hardware=H100
    )
    assert warnings == []


def test_warns_when_declared_width_cannot_hold_the_weights() -> None:
    warnings = config_warnings(
        _llama("70B", 16), width=1, kv_budget_tokens=None, context_tokens=None, hardware=H100
    )
    assert len(warnings) == 1
    assert warnings[0].path == "$.profiles.default.adapter_options.loadtime.tensor_parallel_size"
    assert "tensor_parallel_size 1 cannot hold the weights" in warnings[0].message
    assert "141.2 GB per GPU" in warnings[0].message
    assert "width 2 is the smallest that does" in warnings[0].message


def test_weights_warning_mentions_a_server_with_too_few_devices() -> None:
    warnings = config_warnings(
        _llama("70B", 16),
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
        _llama("70B", 16),
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
        _llama("8B", 16), width=2, kv_budget_tokens=32768, context_tokens=8192, hardware=H100
    )
    assert len(warnings) == 1
    assert "fits one GPU" in warnings[0].message
    assert "tensor_parallel_size is 2" in warnings[0].message
    assert "replica" in warnings[0].message


def test_split_warning_counts_the_kv_budget_when_deciding_one_gpu_fits() -> None:
    # 16.1 GB of weights + 400k tokens x 128 KiB = 68.6 GB: fits 72 GB; 500k tokens does not.
    model = _llama("8B", 16)
    fits = config_warnings(
        model, width=2, kv_budget_tokens=400_000, context_tokens=None, hardware=H100
    )
    split_needed = config_warnings(
        model, width=2, kv_budget_tokens=500_000, context_tokens=None, hardware=H100
    )
    assert any("fits one GPU" in w.message for w in fits)
    assert split_needed == []


def test_weights_only_plan_rounds_up_to_a_power_of_two_and_says_heads_are_unchecked() -> None:
    # Seed 001: 140 GB of fp16 weights need 2 x 72 GB; 300 GB needs 5 -> 8.
    assert plan_weights_only(140e9, H100).width.width == 2
    result = plan_weights_only(300e9, H100)
    assert (result.min_gpus, result.width.width) == (5, 8)
    assert "check that it divides the attention heads" in result.width.reason
    assert result.kv_bytes_per_token is None
    assert plan_weights_only(700e9, H100).width.width is None


def test_weights_warning_suggests_a_width_that_also_holds_the_declared_budget() -> None:
    warnings = config_warnings(
        _llama("70B", 16), width=1, kv_budget_tokens=262144, context_tokens=8192, hardware=H100
    )
    assert len(warnings) == 1
    assert "with kv_budget_tokens 262144, width 4 is the smallest that does" in warnings[0].message
