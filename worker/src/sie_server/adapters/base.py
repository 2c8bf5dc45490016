"""The adapter base class: a declaration the worker reads, never instantiated.

An adapter says which engine serves the model, which task it serves, which
``adapter_options.loadtime`` keys it accepts, which bundle of this image serves it, and
which engine arguments it adds. The worker checks options and builds the engine's command
line from these declarations.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

__all__ = ["Adapter", "EngineKind", "OneTaskAdapter", "Task"]

# The kind of the engine family that serves an adapter: one of sie_worker.engines.registry's
# FAMILIES ("sglang", "vllm", "transformers", ...); the registry is its one list.
EngineKind = str
Task = Literal["generate", "encode", "score"]


class Adapter:
    """Base of every adapter. Subclasses set the class attributes and may add engine args."""

    engine: ClassVar[EngineKind]
    loadtime_options: ClassVar[tuple[str, ...]] = ()
    # The bundle of this image that serves it (SIE's bundles/*.yaml where SIE defines it).
    bundle: ClassVar[str]
    # The oldest SGLang release it runs on (None: any the image has).
    min_sglang: ClassVar[str | None] = None
    # Engine flags the adapter adds itself (each must exist in the engine's release).
    added_flags: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def task(cls, tasks: Mapping[str, Any]) -> Task | None:
        """The task this adapter serves for a model with ``tasks``; None when it cannot tell."""
        raise NotImplementedError

    @classmethod
    def engine_args(
        cls, loadtime: Mapping[str, Any], runtime: Mapping[str, Any] | None = None
    ) -> tuple[str, ...]:
        """Engine arguments this adapter adds, from its (already checked) options."""
        return ()

    @classmethod
    def adapter_path(cls) -> str:
        return f"{cls.__module__}:{cls.__qualname__}"


class OneTaskAdapter(Adapter):
    """An adapter that serves one task (``served_task``) whatever the model's tasks say:
    the bases of the SGLang and vLLM adapters."""

    served_task: ClassVar[Task] = "generate"

    @classmethod
    def task(cls, tasks: Mapping[str, Any]) -> Task | None:
        return cls.served_task
