"""LoRA adapter memory reproduces seed 004, example 15 (multi-LoRA serving): 81,920
parameters per rank per layer for the Llama 3 8B shape, 83.9 MB per rank-16 adapter,
1.34 GB of engine buffers for 4 adapters at rank 64, and 20 fine-tunes as 321.2 GB of
merged models against 17.7 GB as one base plus rank-16 adapters."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sie_worker.config.load.hf_config import parse_hf_config
from sie_worker.sizing.lora import (
    ALL_MODULES,
    adapter_bytes,
    buffer_bytes,
    lora_sizing,
    module_dims,
    params_per_rank_per_layer,
    projection_dims,
)

# Llama 3 8B, one layer (the seed's Module table), 32 layers, 8.03e9 BF16 parameters.
LLAMA_3_8B = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 32,
}
BASE_BYTES = 8.03e9 * 2


def test_the_llama_3_8b_projections_are_the_seeds_modules() -> None:
    dims = projection_dims(parse_hf_config(LLAMA_3_8B))
    assert dims == {
        "q_proj": (4096, 4096), "k_proj": (4096, 1024), "v_proj": (4096, 1024),
        "o_proj": (4096, 4096), "gate_proj": (4096, 14336), "up_proj": (4096, 14336),
        "down_proj": (14336, 4096),
    }  # fmt: skip
    assert params_per_rank_per_layer(dims) == 81920


@pytest.mark.parametrize(
    ("rank", "params", "mb", "share"),
    [(8, 20_971_520, "41.9", "0.26"), (16, 41_943_040, "83.9", "0.52"),
     (64, 167_772_160, "335.5", "2.09")],
)  # fmt: skip
def test_adapter_sizes_are_the_seeds(rank: int, params: int, mb: str, share: str) -> None:
    dims = projection_dims(parse_hf_config(LLAMA_3_8B))
    assert dims is not None
    size = adapter_bytes(rank, params_per_rank_per_layer(dims), 32, 2)
    assert rank * params_per_rank_per_layer(dims) * 32 == params
    assert f"{size / 1e6:.1f}" == mb
    assert f"{100 * size / BASE_BYTES:.2f}" == share


def test_four_buffers_at_rank_64_take_1_34_gb_and_twenty_variants_compare() -> None:
    dims = projection_dims(parse_hf_config(LLAMA_3_8B))
    assert dims is not None
    assert f"{buffer_bytes(4, 64, 81920, 32, 2) / 1e9:.2f}" == "1.34"
    sizing = lora_sizing(adapters=20, dims=dims, layers=32, base_bytes=BASE_BYTES,
                         rank=(16, "r"), max_rank=(64, "flag"), slots=4)  # fmt: skip
    assert f"{sizing.buffer_bytes / 1e9:.2f}" == "1.34"
    assert f"{sizing.merged_bytes / 1e9:.1f}" == "321.2"
    assert f"{sizing.shared_bytes / 1e9:.1f}" == "17.7"
    assert f"{sizing.adapter_bytes / 1e6:.1f}" == "83.9"


def test_only_the_adapted_modules_count() -> None:
    dims = module_dims(4096, 14336, 4096, 1024)
    assert params_per_rank_per_layer(dims, ("q_proj", "v_proj")) == 8192 + 5120
    assert params_per_rank_per_layer(dims, ("lm_head",)) == 0


def test_a_config_without_projection_sizes_gives_none() -> None:
    assert projection_dims(parse_hf_config({"hidden_size": 64})) is None
    assert projection_dims(parse_hf_config({**LLAMA_3_8B, "intermediate_size": True})) is None
    nested = projection_dims(parse_hf_config({"text_config": LLAMA_3_8B}))
    assert nested == projection_dims(parse_hf_config(LLAMA_3_8B))


@given(
    hidden=st.integers(1, 8192), inter=st.integers(1, 32768), q=st.integers(1, 8192),
    kv=st.integers(1, 8192), rank=st.integers(1, 256), layers=st.integers(1, 128),
)  # fmt: skip
def test_an_adapter_is_rank_times_in_plus_out_per_module_per_layer(
    hidden: int, inter: int, q: int, kv: int, rank: int, layers: int
) -> None:
    dims = module_dims(hidden, inter, q, kv)
    expected = rank * layers * sum(i + o for i, o in dims.values())
    assert adapter_bytes(rank, params_per_rank_per_layer(dims, ALL_MODULES), layers, 1) == expected
