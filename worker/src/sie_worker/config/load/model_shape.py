"""A model's shape: its local directory, its ``config.json`` and its attention head counts.

Tensor parallelism splits attention heads between GPUs, so a width must divide
``num_attention_heads`` and be a multiple or a divisor of ``num_key_value_heads``. The counts
come from ``config.json`` (read by :mod:`sie_worker.config.load.hf_config`) in the model's local
directory or the Hugging Face cache; when neither has it, or it does not give both counts as
positive integers, the check is skipped and the engine applies the same rule after it loads
the weights.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sie_worker.config.load.hf_config import HFConfigError, read_hf_config
from sie_worker.config.model import ModelConfig
from sie_worker.config.widths import valid_widths

__all__ = [
    "HeadCounts",
    "ModelPathError",
    "find_config_json",
    "head_counts",
    "hf_hub_cache",
    "local_model_dir",
    "width_fit_problems",
]

_COMMIT = re.compile(r"^[0-9a-f]{40}$")


class ModelPathError(ValueError):
    """``model_path`` does not lead to a directory; the message says which and why."""


@dataclass(frozen=True)
class HeadCounts:
    attention_heads: int
    kv_heads: int
    source: Path


def local_model_dir(config: ModelConfig) -> Path | None:
    """The directory ``model_path`` names, or None without one. Raises :class:`ModelPathError`."""
    raw = config.model_path
    if raw is None:
        return None
    if raw.startswith("package:"):
        module, _, sub = raw.removeprefix("package:").partition("/")
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            raise ModelPathError(
                f"{raw}: Python package {module} is not installed; install it or use a path"
            )
        if spec.submodule_search_locations:
            root = Path(next(iter(spec.submodule_search_locations)))
        elif spec.origin:
            root = Path(spec.origin).parent
        else:
            raise ModelPathError(f"{raw}: {module} has no folder on disk; use a directory path")
        path = root / sub if sub else root
    else:
        path = Path(raw).expanduser()
        if not path.is_absolute():
            if config.base_dir is None:
                raise ModelPathError(
                    f"{raw} is relative but the config has no file to be relative to; "
                    "use an absolute path or package:<module>/<subpath>"
                )
            path = config.base_dir / path
    if not path.is_dir():
        raise ModelPathError(f"{raw}: {path} is not a directory; point model_path at the weights")
    return path


def hf_hub_cache(env: Mapping[str, str]) -> Path:
    """The Hugging Face hub cache, resolved as huggingface_hub does."""
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]).expanduser() / "huggingface" / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def find_config_json(config: ModelConfig, env: Mapping[str, str] | None = None) -> Path | None:
    """``config.json`` from the local model directory, else from the HF cache, else None.

    Cache layout: ``models--org--name/refs/<revision or main>`` holds a commit hash naming
    ``snapshots/<hash>/``; a revision that is itself a commit hash names the snapshot.
    """
    local = local_model_dir(config)
    if local is not None:
        candidate = local / "config.json"
        return candidate if candidate.is_file() else None
    repo = hf_hub_cache(os.environ if env is None else env) / (
        "models--" + config.hf_id.replace("/", "--")
    )
    revision = config.revision or "main"
    if _COMMIT.match(revision):
        snapshot = revision
    else:
        try:
            snapshot = (repo / "refs" / revision).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            return None
    if not snapshot or "/" in snapshot or snapshot.startswith("."):
        return None
    candidate = repo / "snapshots" / snapshot / "config.json"
    return candidate if candidate.is_file() else None


def head_counts(config: ModelConfig, env: Mapping[str, str] | None = None) -> HeadCounts | None:
    """Attention and KV head counts from the model's config.json; None when unknown."""
    path = find_config_json(config, env)
    if path is None:
        return None
    try:
        hf = read_hf_config(path)
    except HFConfigError:
        return None
    if hf.attention_heads is None or hf.kv_heads is None:
        return None
    return HeadCounts(hf.attention_heads, hf.kv_heads, path)


def width_fit_problems(width: int, counts: HeadCounts) -> list[str]:
    """Why ``width`` cannot split this model's heads (empty when it can)."""
    fitting = ", ".join(str(w) for w in valid_widths(counts.attention_heads, counts.kv_heads))
    tail = f" (from {counts.source}); widths that fit this model: {fitting}"
    problems: list[str] = []
    if counts.attention_heads % width:
        problems.append(
            f"{width} does not divide num_attention_heads {counts.attention_heads}{tail}"
        )
    kv = counts.kv_heads
    if kv % width and width % kv:
        problems.append(
            f"{width} is neither a multiple nor a divisor of num_key_value_heads {kv}{tail}"
        )
    return problems
