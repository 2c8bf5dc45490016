"""A profile's ``adapter_path``: an adapter of this image, one SIE defines that this image
does not run, or none at all.

- The adapters this image runs (:data:`KNOWN_ADAPTERS`) are declarations in
  :mod:`sie_server.adapters` under SIE's own paths (plus this project's chat, vLLM and
  transformers adapters); only these modules are ever imported, so a config cannot make the
  worker import arbitrary code.
- Every other path SIE 0.10.1 defines (:mod:`sie_worker.config.sie_adapters`) reads fine and
  is refused when the model loads (:class:`NotServedHere`), naming this image's bundles and
  SIE's bundle for it.
- Anything else (a typo, a custom ``adapter.py:Class``) is refused when the config is read
  (:class:`UnknownAdapter`), with the closest spelling.

SIE's legacy ``sie_server.adapters.sglang:SGLang{Generation,Embedding}Adapter`` resolve to
the submodules, as SIE's loader remaps them.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Mapping
from typing import Any

from sie_server.adapters.base import Adapter, EngineKind
from sie_worker.config.model import ModelConfig
from sie_worker.config.sie_adapters import sie_adapters, sie_version
from sie_worker.engines.default.family import SIE_TRANSFORMERS_ADAPTERS, TRANSFORMERS
from sie_worker.engines.registry import FAMILIES, IMAGE_BUNDLES, family_of
from sie_worker.engines.sglang.family import (
    CHAT,
    CUDA13,
    EMBEDDING,
    GEMMA,
    GENERATION,
    STRICT_THINKING,
)
from sie_worker.engines.vllm.family import EMBEDDING as VLLM_EMBEDDING
from sie_worker.engines.vllm.family import GENERATION as VLLM_GENERATION

__all__ = [
    "CHAT",
    "CUDA13",
    "EMBEDDING",
    "GEMMA",
    "GENERATION",
    "IMAGE_BUNDLES",
    "KNOWN_ADAPTERS",
    "LEGACY_PATHS",
    "OWN_ADAPTERS",
    "SIE_TRANSFORMERS_ADAPTERS",
    "STRICT_THINKING",
    "TRANSFORMERS",
    "VLLM_EMBEDDING",
    "VLLM_GENERATION",
    "NotServedHere",
    "UnknownAdapter",
    "adapter_problem",
    "canonical_path",
    "default_adapter_path",
    "not_served_here",
    "resolve_adapter",
    "serving_bundles",
]

# Every adapter path this image runs: its engine families' (the SGLang and vLLM adapters,
# ours and SIE's; the default engine's and SIE's transformers ones).
KNOWN_ADAPTERS: tuple[str, ...] = tuple(a for f in FAMILIES.values() for a in f.adapters)
# This project's own adapters (in SIE's namespace; SIE 0.10.1 defines none of them).
OWN_ADAPTERS: tuple[str, ...] = tuple(a for f in FAMILIES.values() for a in f.own_adapters)
LEGACY_PATHS: Mapping[str, str] = {
    "sie_server.adapters.sglang:SGLangGenerationAdapter": GENERATION,
    "sie_server.adapters.sglang:SGLangEmbeddingAdapter": EMBEDDING,
}


class UnknownAdapter(ValueError):
    """``adapter_path`` names no adapter; the message gives the closest spelling."""


class NotServedHere(ValueError):
    """``adapter_path`` is an adapter SIE defines that this image does not run."""

    def __init__(self, path: str) -> None:
        self.path = path
        entry = sie_adapters().get(path)
        sie = entry.bundles if entry is not None else ()
        where = (
            f"SIE serves it with the {' or '.join(sie)} bundle of its own server image (sie-server)"
            if sie
            else "no SIE bundle carries it either"
        )
        super().__init__(
            f"{path} is an adapter of SIE {sie_version()} that this image does not run (this "
            f"image's bundles: {', '.join(IMAGE_BUNDLES)}); {where}"
        )


def canonical_path(path: str) -> str:
    """``path`` with SIE's legacy spellings replaced by the paths they stand for."""
    return LEGACY_PATHS.get(path, path)


def adapter_problem(path: str) -> str | None:
    """Why ``path`` names no adapter SIE defines or this image runs (read time), or None."""
    path = canonical_path(path)
    if path in KNOWN_ADAPTERS or path in sie_adapters():
        return None
    return _unknown(path)


def resolve_adapter(path: str) -> type[Adapter]:
    """The declaration of an adapter this image runs. Raises :class:`NotServedHere` for one
    SIE defines that this image does not run, :class:`UnknownAdapter` for any other path."""
    path = canonical_path(path)
    if path not in KNOWN_ADAPTERS:
        if path in sie_adapters():
            raise NotServedHere(path)
        raise UnknownAdapter(_unknown(path))
    module_name, _, class_name = path.partition(":")
    found = getattr(importlib.import_module(module_name), class_name)
    assert isinstance(found, type), path
    assert issubclass(found, Adapter), path
    return found


def serving_bundles(adapter: type[Adapter]) -> tuple[str, ...]:
    """The bundles of this image that run ``adapter``, its own bundle first."""
    return family_of(adapter.engine).serving_bundles(adapter)


def not_served_here(config: ModelConfig) -> dict[str, str]:
    """``{profile: adapter_path}`` of the profiles whose adapter this image does not run
    (SIE adapters of other bundles; the config read fine, so every path is a known one)."""
    return {
        name: canonical_path(profile.adapter_path)
        for name, profile in config.profiles.items()
        if profile.adapter_path is not None
        and canonical_path(profile.adapter_path) not in KNOWN_ADAPTERS
    }


def default_adapter_path(engine: EngineKind, tasks: Mapping[str, Any]) -> str:
    """The adapter of a profile without ``adapter_path``, for the engine of the worker's
    bundle (:func:`~sie_worker.engines.registry.bundle_engine`): transformers on the
    default bundle; on an engine's bundles that engine's generation adapter, or its
    embedding adapter when the model's only task is ``encode``."""
    return family_of(engine).default_adapter(tasks)


def _unknown(path: str) -> str:
    if ":" not in path:
        why = "it is not module:Class"
    elif path.partition(":")[0].endswith(".py") or "/" in path:
        why = "custom adapter code from the model's folder is not run by this worker"
    else:
        why = f"neither SIE {sie_version()} nor this image defines it"
    names = sorted({*KNOWN_ADAPTERS, *sie_adapters()})
    close = difflib.get_close_matches(path, names, n=1, cutoff=0.6)
    if not close:  # a misspelled class in a known module
        module = path.partition(":")[0]
        close = [n for n in names if n.partition(":")[0] == module][:1]
    hint = (
        f"did you mean {close[0]}?"
        if close
        else "adapters this image runs: " + ", ".join(KNOWN_ADAPTERS)
    )
    return f"unknown adapter {path!r} ({why}); {hint}"
