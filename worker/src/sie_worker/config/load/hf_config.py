"""A model's Hugging Face ``config.json``, read in one place for every part that needs it.

The language model's fields come from ``text_config``, ``llm_config`` or
``language_config`` when one of them names an attention head count (multimodal models), else
from the top level:

- layers: ``num_hidden_layers`` | ``n_layer`` | ``num_layers``
- attention heads: ``num_attention_heads`` | ``n_head`` | ``num_heads``
- KV heads: ``num_key_value_heads`` | ``n_head_kv`` | ``num_kv_heads``; 1 with
  ``multi_query: true``; else the attention heads
- hidden size: ``hidden_size`` | ``n_embd`` | ``d_model``; ``intermediate_size`` (the MLP's)
- head_dim: ``head_dim``, else the hidden size over the heads
- latent KV width (multi-head latent attention): ``kv_lora_rank`` + ``qk_rope_head_dim``
- ``max_position_embeddings``
- routed experts (a mixture-of-experts model): ``n_routed_experts`` | ``num_experts`` |
  ``num_local_experts``; 0 (as some dense models write it) or absent is none
- bits per weight: ``quantization_config`` (top level or the section), else
  ``torch_dtype`` | ``dtype`` (the section's, then the top level's)

The first of a field's names that is present decides: a value that is not a positive
integer is recorded in :attr:`HFConfig.invalid` under the field, never passed over for a
later name. What a caller does with an unknown or invalid field is its own rule: the
load-time width check skips (the engine checks the heads itself), ``size`` refuses.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

__all__ = ["HFConfig", "HFConfigError", "dtype_bits", "parse_hf_config", "read_hf_config"]

_SECTIONS = ("text_config", "llm_config", "language_config")
_LAYERS = ("num_hidden_layers", "n_layer", "num_layers")
_HEADS = ("num_attention_heads", "n_head", "num_heads")
_KV_HEADS = ("num_key_value_heads", "n_head_kv", "num_kv_heads")
_HIDDEN = ("hidden_size", "n_embd", "d_model")
_EXPERTS = ("n_routed_experts", "num_experts", "num_local_experts")
_FLOAT_BITS = {
    "float32": 32,
    "float": 32,
    "fp32": 32,
    "bfloat16": 16,
    "bf16": 16,
    "float16": 16,
    "half": 16,
    "fp16": 16,
    "float8_e4m3fn": 8,
    "float8_e5m2": 8,
    "fp8": 8,
}
# Per-group scale (16 bits) and zero point (the weight's own bits) of GPTQ/AWQ-style groups.
_GROUP_OVERHEAD_BITS = 16


class HFConfigError(ValueError):
    """config.json cannot be read or is not a JSON object; the message names the file."""


@dataclass(frozen=True)
class HFConfig:
    """The fields of one config.json; None where absent (or, see ``invalid``, not valid)."""

    source: str  # the file, for messages
    layers: int | None
    attention_heads: int | None
    kv_heads: int | None
    head_dim: int | None
    kv_latent_dim: int | None
    max_position_embeddings: int | None
    hidden_size: int | None
    intermediate_size: int | None
    bits_per_weight: float | None  # from quantization_config or the dtype; None when unknown
    bits_source: str
    quantized: bool
    experts: int | None = None  # routed experts of a mixture-of-experts model
    # field (as the attributes above) -> why its value is not usable, naming the key.
    invalid: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


def dtype_bits(name: str) -> int | None:
    """Bits of one weight in a torch dtype name (``bfloat16`` -> 16); None when unknown."""
    return _FLOAT_BITS.get(name.lower())


def read_hf_config(path: Path) -> HFConfig:
    """Parse the config.json at ``path``. Raises :class:`HFConfigError` naming the file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HFConfigError(f"{path}: cannot read: {exc}") from exc
    if not isinstance(data, Mapping):
        raise HFConfigError(f"{path}: not a JSON object")
    return parse_hf_config(data, source=str(path))


def parse_hf_config(data: Mapping[str, Any], *, source: str = "config.json") -> HFConfig:
    """The fields of a parsed config.json (see the module docstring for where each is read)."""
    section = _section(data)
    invalid: dict[str, str] = {}

    def number(name: str, keys: tuple[str, ...]) -> int | None:
        for key in keys:
            if key not in section or section[key] is None:
                continue
            value = section[key]
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                invalid.setdefault(
                    name, f"{source}: {key} is {value!r}, expected a positive integer"
                )
                return None
            return value
        return None

    layers = number("layers", _LAYERS)
    heads = number("attention_heads", _HEADS)
    kv = number("kv_heads", _KV_HEADS)
    if kv is None and "kv_heads" not in invalid and heads is not None:
        kv = 1 if section.get("multi_query") is True else heads
    hidden = number("hidden_size", _HIDDEN)
    intermediate = number("intermediate_size", ("intermediate_size",))
    head_dim = number("head_dim", ("head_dim",))
    if head_dim is None and "head_dim" not in invalid:
        if "hidden_size" in invalid:
            invalid["head_dim"] = invalid["hidden_size"]
        elif hidden is not None and heads is not None:
            head_dim = hidden // heads
    latent = None
    rank = number("kv_latent_dim", ("kv_lora_rank",))
    rope = number("kv_latent_dim", ("qk_rope_head_dim",))
    if rank is not None and "kv_latent_dim" not in invalid:
        latent = rank + (rope or 0)
    positions = number("max_position_embeddings", ("max_position_embeddings",))
    bits, bits_source, quantized = _bits(data, section)
    experts = _experts(section, source, invalid)
    return HFConfig(
        source=source,
        layers=layers,
        attention_heads=heads,
        kv_heads=kv,
        head_dim=head_dim,
        kv_latent_dim=latent,
        max_position_embeddings=positions,
        hidden_size=hidden,
        intermediate_size=intermediate,
        bits_per_weight=bits,
        bits_source=bits_source,
        quantized=quantized,
        experts=experts,
        invalid=MappingProxyType(invalid),
    )


def _section(data: Mapping[str, Any]) -> Mapping[str, Any]:
    for key in _SECTIONS:
        inner = data.get(key)
        if isinstance(inner, Mapping) and any(k in inner for k in _HEADS):
            return inner
    return data


def _experts(section: Mapping[str, Any], source: str, invalid: dict[str, str]) -> int | None:
    """The routed expert count, None for a dense model (0 is written by some dense models)."""
    for key in _EXPERTS:
        value = section.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            invalid["experts"] = f"{source}: {key} is {value!r}, expected a whole number of experts"
            return None
        return value or None
    return None


def _bits(data: Mapping[str, Any], section: Mapping[str, Any]) -> tuple[float | None, str, bool]:
    """(bits per weight, where they came from, quantized?) from dtype / quantization_config."""
    quant = data.get("quantization_config") or section.get("quantization_config")
    if isinstance(quant, Mapping):
        method = str(quant.get("quant_method", "")).lower()
        bits = quant.get("bits", quant.get("w_bit"))
        if isinstance(bits, int | float) and not isinstance(bits, bool) and bits > 0:
            group = quant.get("group_size", quant.get("q_group_size"))
            extra = (
                (_GROUP_OVERHEAD_BITS + bits) / group
                if isinstance(group, int) and not isinstance(group, bool) and group > 0
                else 0.0
            )
            return float(bits) + extra, f"quantization_config ({method or 'bits'})", True
        if method in ("fp8", "fbgemm_fp8"):
            return 8.0, f"quantization_config ({method})", True
        if quant.get("load_in_8bit") is True:
            return 8.0, "quantization_config (load_in_8bit)", True
        if quant.get("load_in_4bit") is True:
            return 4.5, "quantization_config (load_in_4bit)", True
        return None, f"quantization_config ({method or 'unknown'})", True
    for holder in (section, data):
        for key in ("torch_dtype", "dtype"):
            name = holder.get(key)
            if isinstance(name, str) and dtype_bits(name) is not None:
                return float(_FLOAT_BITS[name.lower()]), f"config.json {key}", False
    return None, "unknown", False
