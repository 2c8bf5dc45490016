from __future__ import annotations

import pytest
from tests.support.sizing_figures import GB, H100, LLAMA, SEED_004_TABLE, SEED_004_USERS, llama_size

from sie_worker.sizing.arithmetic import (
    kv_bytes_per_token,
    max_concurrency,
    minimum_gpus,
    usable_bytes,
)
from sie_worker.sizing.model_stats import shape_from_config
from sie_worker.sizing.plan import plan, plan_weights_only
from sie_worker.sizing.width import choose_width


@pytest.mark.parametrize(("name", "bits", "weights", "kv", "total", "gpus"), SEED_004_TABLE)
def test_plan_reproduces_seed_004_why_split_table(
    name: str, bits: float, weights: float, kv: float, total: float, gpus: int
) -> None:
    result = plan(llama_size(name, bits), SEED_004_USERS, H100)
    assert round(result.weights_bytes / GB, 1) == weights
    assert result.kv_bytes_total is not None
    assert round(result.kv_bytes_total / GB, 1) == kv
    assert round(result.total_bytes / GB, 1) == total
    assert result.min_gpus == gpus


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


def test_replica_budget_and_concurrency_follow_the_weights_left_per_gpu() -> None:
    result = plan(llama_size("70B", 16), SEED_004_USERS, H100)
    assert result.weights_bytes_per_gpu == pytest.approx(141.2e9 / 4)
    assert result.kv_budget_bytes_per_replica == pytest.approx(4 * 72e9 - 141.2e9)
    per_token = kv_bytes_per_token(llama_size("70B", 16).shape)
    assert result.kv_budget_tokens_per_replica == int((4 * 72e9 - 141.2e9) // per_token)
    assert result.concurrency_per_replica == int((4 * 72e9 - 141.2e9) // (per_token * 8192))
    assert result.concurrency_per_replica >= SEED_004_USERS.sequences
    assert result.replicas_per_node == 2


def test_weights_only_plan_rounds_up_to_a_power_of_two_and_says_heads_are_unchecked() -> None:
    # Seed 001: 140 GB of fp16 weights need 2 x 72 GB; 300 GB needs 5 -> 8.
    assert plan_weights_only(140e9, H100).width.width == 2
    result = plan_weights_only(300e9, H100)
    assert (result.min_gpus, result.width.width) == (5, 8)
    assert "check that it divides the attention heads" in result.width.reason
    assert result.kv_bytes_per_token is None
    # 700 GB need 10 GPUs: beyond a node of 8, two nodes of TP=8 (test_layout).
    beyond = plan_weights_only(700e9, H100)
    assert (beyond.min_gpus, beyond.width.width, beyond.layout.nodes) == (10, 16, 2)
    assert plan_weights_only(5000e9, H100).width.width is None
