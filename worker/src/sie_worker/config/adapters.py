"""Resolve a profile's ``adapter_path`` to an adapter class from :mod:`sie_server.adapters`.

Only modules inside ``sie_server.adapters`` are imported: a config file cannot make the
worker import arbitrary code.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Mapping
from typing import Any

from sie_server.adapters.base import Adapter

__all__ = [
    "CHAT",
    "EMBEDDING",
    "GENERATION",
    "KNOWN_ADAPTERS",
    "TRANSFORMERS",
    "UnknownAdapter",
    "default_adapter_path",
    "resolve_adapter",
]

GENERATION = "sie_server.adapters.sglang.generation:SGLangGenerationAdapter"
EMBEDDING = "sie_server.adapters.sglang.embedding:SGLangEmbeddingAdapter"
CHAT = "sie_server.adapters.sglang.chat:SGLangChatAdapter"
TRANSFORMERS = "sie_server.adapters.transformers:TransformersAdapter"
KNOWN_ADAPTERS: tuple[str, ...] = (GENERATION, EMBEDDING, CHAT, TRANSFORMERS)
_PACKAGE = "sie_server.adapters"


class UnknownAdapter(ValueError):
    """``adapter_path`` names no adapter; the message lists the closest and the known ones."""


def resolve_adapter(path: str) -> type[Adapter]:
    module_name, _, class_name = path.partition(":")
    if not class_name or not (module_name == _PACKAGE or module_name.startswith(_PACKAGE + ".")):
        raise UnknownAdapter(_unknown(path, "is not module:Class inside sie_server.adapters"))
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        raise UnknownAdapter(_unknown(path, f"module {module_name} does not exist")) from None
    found = getattr(module, class_name, None)
    if not (isinstance(found, type) and issubclass(found, Adapter) and hasattr(found, "engine")):
        raise UnknownAdapter(_unknown(path, f"{module_name} has no adapter class {class_name}"))
    return found


def default_adapter_path(bundle_has_sglang: bool, tasks: Mapping[str, Any]) -> str:
    """The adapter of a profile without ``adapter_path``: transformers on the default bundle;
    on SGLang bundles generation, or embedding when the model's only task is ``encode``."""
    if not bundle_has_sglang:
        return TRANSFORMERS
    return EMBEDDING if set(tasks) == {"encode"} else GENERATION


def _unknown(path: str, why: str) -> str:
    close = difflib.get_close_matches(path, KNOWN_ADAPTERS, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]}?" if close else "known adapters: " + ", ".join(KNOWN_ADAPTERS)
    return f"unknown adapter {path!r} ({why}); {hint}"
