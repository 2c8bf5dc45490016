"""The adapter base class: a declaration the worker reads, never instantiated.

An adapter says which engine serves the model, which task it serves, which
``adapter_options.loadtime`` keys it accepts and which engine arguments it adds. The
worker checks options and builds the engine's command line from these declarations.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

__all__ = ["Adapter", "EngineKind", "Task"]

EngineKind = Literal["sglang", "transformers"]
Task = Literal["generate", "encode", "score"]


class Adapter:
    """Base of every adapter. Subclasses set the class attributes and may add engine args."""

    engine: ClassVar[EngineKind]
    loadtime_options: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def task(cls, tasks: Mapping[str, Any]) -> Task | None:
        """The task this adapter serves for a model with ``tasks``; None when it cannot tell."""
        raise NotImplementedError

    @classmethod
    def engine_args(cls, loadtime: Mapping[str, Any]) -> tuple[str, ...]:
        """Engine arguments this adapter adds, from its (already checked) load-time options."""
        return ()

    @classmethod
    def adapter_path(cls) -> str:
        return f"{cls.__module__}:{cls.__qualname__}"
