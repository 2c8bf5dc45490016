"""One reader of a model's config.json: the load-time width check (``head_counts``) and
``sie-worker size`` (``shape_from_config``) see the same heads, from the same section."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sie_worker.config.files.reader import parse_config
from sie_worker.config.load.hf_config import HFConfigError, parse_hf_config, read_hf_config
from sie_worker.config.load.model_shape import head_counts
from sie_worker.sizing.model_stats import ModelStatsError, shape_from_config

_BASE = {"num_hidden_layers": 32, "num_attention_heads": 32, "hidden_size": 4096}


def _head_counts(body: Any, folder: Path) -> tuple[int, int] | None:
    """What the load-time width check reads from ``body`` as the model's config.json."""
    (folder / "config.json").write_text(json.dumps(body), encoding="utf-8")
    model = parse_config(
        {
            "sie_id": "org/model",
            "hf_id": "org/model",
            "model_path": str(folder),
            "tasks": {"generate": {}},
            "profiles": {"default": {}},
        },
        source="m.yaml",
    )
    counts = head_counts(model)
    return None if counts is None else (counts.attention_heads, counts.kv_heads)


def _sizing_heads(body: dict[str, Any]) -> tuple[int, int] | str:
    """What ``size`` reads: the heads, or its refusal."""
    try:
        shape = shape_from_config(body)
    except ModelStatsError as exc:
        return str(exc)
    return shape.attention_heads, shape.kv_heads


@pytest.mark.parametrize(
    ("extra", "bits", "quantized"),
    [
        ({"torch_dtype": "bfloat16"}, 16.0, False),
        ({"torch_dtype": None, "dtype": "float32"}, 32.0, False),
        ({"quantization_config": {"quant_method": "fp8"}}, 8.0, True),
        # AWQ 4-bit, group 128: a 16-bit scale and a 4-bit zero point per 128 weights.
        (
            {"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128}},
            4.15625,
            True,
        ),
    ],
)
def test_bits_per_weight_from_dtype_or_quantization(
    extra: dict[str, Any], bits: float, quantized: bool
) -> None:
    config = parse_hf_config({**_BASE, "torch_dtype": "bfloat16", **extra})
    assert config.bits_per_weight == bits
    assert config.quantized is quantized


# Each of these once read differently in the width check and in `size`.
@pytest.mark.parametrize(
    ("body", "heads"),
    [
        # num_heads: the width check read it, `size` said num_attention_heads was missing.
        ({"num_hidden_layers": 12, "num_heads": 12, "d_model": 768}, (12, 12)),
        # multi_query: `size` read one KV head, the width check as many as attention heads.
        ({**_BASE, "num_attention_heads": 71, "multi_query": True}, (71, 1)),
        # A text_config naming its heads as n_head: only the width check looked inside.
        (
            {
                **_BASE,
                "num_attention_heads": 8,
                "text_config": {"n_layer": 4, "n_head": 16, "n_head_kv": 2, "n_embd": 1024},
            },
            (16, 2),
        ),
    ],
)
def test_width_check_and_sizing_read_the_same_heads(
    body: dict[str, Any], heads: tuple[int, int], tmp_path: Path
) -> None:
    assert _head_counts(body, tmp_path) == heads
    assert _sizing_heads(body) == heads


@pytest.mark.parametrize(
    ("body", "named"),
    [
        # The width check passed over a bad first name to a later one (n_head: 8).
        ({**_BASE, "num_attention_heads": 0, "n_head": 8}, "num_attention_heads is 0"),
        # The width check took a bad KV count for "absent" and assumed 32 KV heads.
        ({**_BASE, "num_key_value_heads": "8"}, "num_key_value_heads is '8'"),
        # `size` read this text_config, the width check the top level's 32 heads.
        ({**_BASE, "text_config": {"num_attention_heads": "28"}}, "num_attention_heads is '28'"),
    ],
)
def test_a_bad_head_count_is_unknown_to_the_width_check_and_refused_by_sizing(
    body: dict[str, Any], named: str, tmp_path: Path
) -> None:
    assert _head_counts(body, tmp_path) is None  # skipped: the engine checks the heads itself
    refusal = _sizing_heads(body)
    assert isinstance(refusal, str)
    assert f"{named}, expected a positive integer" in refusal


def test_unreadable_config_json_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(HFConfigError, match=r"config\.json: cannot read"):
        read_hf_config(path)
    path.write_text("[]", encoding="utf-8")
    with pytest.raises(HFConfigError, match=r"config\.json: not a JSON object"):
        read_hf_config(path)


def test_mla_latent_width_is_the_lora_rank_plus_the_rope_dims() -> None:
    config = parse_hf_config({**_BASE, "kv_lora_rank": 512, "qk_rope_head_dim": 64})
    assert config.kv_latent_dim == 576
    assert parse_hf_config(_BASE).kv_latent_dim is None


_VALUES = st.one_of(
    st.integers(min_value=-1, max_value=40),
    st.none(),
    st.booleans(),
    st.sampled_from(["8", "", 2.5]),
)
_HEAD_KEYS = (
    "num_attention_heads",
    "n_head",
    "num_heads",
    "num_key_value_heads",
    "n_head_kv",
    "num_kv_heads",
    "multi_query",
)
# Layers and head_dim are always valid, so `size` can refuse only for the heads.
_SECTIONS = st.dictionaries(st.sampled_from(_HEAD_KEYS), _VALUES, max_size=5).map(
    lambda heads: {"num_hidden_layers": 4, "head_dim": 64, **heads}
)


@settings(max_examples=300)
@given(
    top=_SECTIONS,
    inner=st.none() | _SECTIONS,
    where=st.sampled_from(["text_config", "llm_config", "language_config"]),
)
def test_width_check_knows_the_heads_exactly_when_sizing_does(
    top: dict[str, Any], inner: dict[str, Any] | None, where: str
) -> None:
    body = dict(top) if inner is None else {**top, where: inner}
    with tempfile.TemporaryDirectory() as folder:
        counts = _head_counts(body, Path(folder))
    sizing = _sizing_heads(body)
    assert counts == (sizing if isinstance(sizing, tuple) else None), sizing


@pytest.mark.parametrize(
    ("data", "hidden", "intermediate", "head_dim"),
    [
        ({"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32}, 4096,
         14336, 128),
        ({"n_embd": 768, "n_head": 12}, 768, None, 64),  # GPT-2 spellings, no MLP size
        ({"text_config": {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4},
          "hidden_size": 9}, 64, 128, 16),  # a multimodal model's text model
    ],
)  # fmt: skip
def test_hidden_and_intermediate_sizes_come_from_the_text_models_section(
    data: dict[str, Any], hidden: int, intermediate: int | None, head_dim: int
) -> None:
    hf = parse_hf_config(data)
    assert (hf.hidden_size, hf.intermediate_size, hf.head_dim) == (hidden, intermediate, head_dim)


def test_a_bad_hidden_size_is_invalid_for_the_head_dim_it_would_give() -> None:
    hf = parse_hf_config({"hidden_size": "4096", "num_attention_heads": 32})
    assert (hf.hidden_size, hf.head_dim) == (None, None)
    assert hf.invalid["head_dim"] == hf.invalid["hidden_size"]
    assert "hidden_size is '4096'" in hf.invalid["hidden_size"]


@pytest.mark.parametrize(
    ("data", "experts"),
    [
        ({**_BASE, "n_routed_experts": 256, "num_experts_per_tok": 8}, 256),  # DeepSeek-V3
        ({**_BASE, "num_experts": 128}, 128),  # Qwen3-MoE
        ({**_BASE, "num_local_experts": 8}, 8),  # Mixtral
        ({"text_config": {**_BASE, "num_local_experts": 16}}, 16),  # Llama 4's text model
        ({**_BASE, "num_experts": 0}, None),  # a dense model that writes 0
        ({**_BASE, "num_experts": None, "num_local_experts": 8}, 8),
        (_BASE, None),
    ],
)
def test_routed_experts_mark_a_mixture_of_experts_model(
    data: dict[str, Any], experts: int | None
) -> None:
    assert parse_hf_config(data).experts == experts


def test_a_bad_expert_count_is_invalid_naming_the_key() -> None:
    hf = parse_hf_config({**_BASE, "n_routed_experts": "256"})
    assert hf.experts is None
    assert hf.invalid["experts"] == (
        "config.json: n_routed_experts is '256', expected a whole number of experts"
    )
