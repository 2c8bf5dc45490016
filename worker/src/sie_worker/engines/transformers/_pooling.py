"""Decide how to pool a model directory's token states into one vector per input. Pure.

A sentence-transformers directory (``modules.json``) whose stack is the common
Transformer → Pooling (one mode) → optional Normalize is served natively with ``AutoModel``:
same numbers, without importing sentence-transformers (several seconds of imports on a
small CPU). Any other stack returns ``None`` and is served by sentence-transformers itself.
A plain Hugging Face directory gets mean pooling. Embeddings are always L2-normalised.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

__all__ = ["PoolingMode", "PoolingPlan", "pooling_plan"]

PoolingMode = Literal["mean", "cls", "max", "mean_sqrt_len", "lasttoken"]

_MODE_KEYS: dict[str, PoolingMode] = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
    "pooling_mode_lasttoken": "lasttoken",
}
_MODE_NAMES: dict[str, PoolingMode] = {
    "mean": "mean",
    "cls": "cls",
    "max": "max",
    "mean_sqrt_len_tokens": "mean_sqrt_len",
    "lasttoken": "lasttoken",
}
_NEUTRAL_POOLING_KEYS = {"word_embedding_dimension", "embedding_dimension", "include_prompt"}
_ST_CONFIG_KEYS = {"max_seq_length", "do_lower_case"}
# sentence-transformers 6 writes these for a plain text encoder; other values need it
_ST_NEUTRAL_VALUES: dict[str, object] = {
    "transformer_task": "feature-extraction",
    "modality_config": {"text": {"method": "forward", "method_output_name": "last_hidden_state"}},
    "module_output_name": "token_embeddings",
}


@dataclass(frozen=True)
class PoolingPlan:
    mode: PoolingMode
    max_seq_length: int | None  # None: the tokenizer's own limit
    lowercase: bool


def pooling_plan(model_dir: Path) -> PoolingPlan | None:
    """The native plan for ``model_dir``, or None when sentence-transformers must serve it."""
    modules_file = model_dir / "modules.json"
    if not modules_file.is_file():
        return PoolingPlan(mode="mean", max_seq_length=None, lowercase=False)
    modules = _read_json(modules_file)
    if not isinstance(modules, list) or _uses_default_prompt(model_dir):
        return None
    kinds = [
        str(m.get("type", "")).rsplit(".", 1)[-1] if isinstance(m, dict) else "" for m in modules
    ]
    if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        return None
    if modules[0].get("path", "") not in ("", "."):
        return None
    mode = _pooling_mode(model_dir / str(modules[1].get("path", "")) / "config.json")
    st_config = _read_json(model_dir / "sentence_bert_config.json") or {}
    if mode is None or not isinstance(st_config, dict) or not _plain_text_encoder(st_config):
        return None
    max_len = st_config.get("max_seq_length")
    return PoolingPlan(
        mode=mode,
        max_seq_length=max_len if isinstance(max_len, int) and max_len > 0 else None,
        lowercase=bool(st_config.get("do_lower_case", False)),
    )


def _pooling_mode(config_file: Path) -> PoolingMode | None:
    config = _read_json(config_file)
    if not isinstance(config, dict):
        return None
    named = config.get("pooling_mode")
    if isinstance(named, str):
        rest = set(config) - _NEUTRAL_POOLING_KEYS - {"pooling_mode"}
        return _MODE_NAMES.get(named) if not any(config[k] for k in rest) else None
    chosen = [mode for key, mode in _MODE_KEYS.items() if config.get(key)]
    others = set(config) - _NEUTRAL_POOLING_KEYS - set(_MODE_KEYS)
    if len(chosen) != 1 or any(config[k] for k in others):
        return None
    if config.get("include_prompt", True) is not True:
        return None
    return chosen[0]


def _plain_text_encoder(st_config: dict[str, Any]) -> bool:
    return all(
        key in _ST_CONFIG_KEYS or _ST_NEUTRAL_VALUES.get(key, object()) == value
        for key, value in st_config.items()
    )


def _uses_default_prompt(model_dir: Path) -> bool:
    config = _read_json(model_dir / "config_sentence_transformers.json")
    return isinstance(config, dict) and bool(config.get("default_prompt_name"))


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
