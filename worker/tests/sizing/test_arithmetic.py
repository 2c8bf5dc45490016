from __future__ import annotations

import pytest
from tests.support.sizing_figures import LLAMA, llama_size

from sie_worker.sizing.arithmetic import (
    Shape,
    kv_bytes_per_token,
    kv_bytes_per_token_per_gpu,
    max_concurrency,
    minimum_gpus,
)
from sie_worker.sizing.model_stats import shape_from_config


@pytest.mark.parametrize(("name", "kib"), [("8B", 128), ("70B", 320), ("405B", 504)])
def test_kv_per_token_matches_seed_004(name: str, kib: int) -> None:
    assert kv_bytes_per_token(llama_size(name, 16).shape) / 1024 == kib


def test_head_dim_comes_from_hidden_size_over_heads_when_absent() -> None:
    assert shape_from_config(LLAMA["70B"][1]).head_dim == 128


def test_minimum_gpus_does_not_round_up_an_exact_fit() -> None:
    assert minimum_gpus(144e9, 80e9, 0.9) == 2
    assert minimum_gpus(144e9 + 1e6, 80e9, 0.9) == 3


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


def test_max_concurrency_refuses_an_empty_sequence() -> None:
    with pytest.raises(ValueError, match="kv_bytes_per_sequence"):
        max_concurrency(1e9, 0)


# Warnings for a declared config (issue 12, item 3).
