"""``sie_server.adapters.transformers:TransformersAdapter``: the CPU / single-GPU default.

Runs ``python -m sie_worker.engines.transformers``: one process on one device, so it refuses
``tensor_parallel_size`` when the model loads. :class:`SieTransformersAdapter` is the base of
the SIE adapters this engine serves faithfully (plain dense text embeddings, BERT-style
cross-encoders): each is declared under SIE's own module path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from sie_server.adapters.base import Adapter, EngineKind, Task

__all__ = ["ENGINE_OPTIONS", "PASSTHROUGH_OPTIONS", "SieTransformersAdapter", "TransformersAdapter"]

# The worker's own options for this engine (timeouts, device, threads, batch size).
ENGINE_OPTIONS: tuple[str, ...] = (
    "request_read_timeout_s",
    "startup_timeout_s",
    "device",
    "threads",
    "max_batch_size",
    # What the model reserves on its device (GiB), instead of its weight files x 1.2 + 1 GiB.
    "memory_gib",
    # LoRA adapters served on a generating model (peft), chosen per request.
    "lora_paths",
    "max_loras_per_batch",
)

PASSTHROUGH_OPTIONS: tuple[str, ...] = ("config_kwargs", "trust_remote_code", "mlx_repo")


class TransformersAdapter(Adapter):
    """Embeddings, cross-encoder scores or generation with transformers /
    sentence-transformers on one device."""

    engine: ClassVar[EngineKind] = "transformers"
    bundle: ClassVar[str] = "default"
    loadtime_options = ENGINE_OPTIONS

    @classmethod
    def task(cls, tasks: Mapping[str, Any]) -> Task | None:
        # One engine serves one task; a config declaring several is refused at load time.
        for task in ("encode", "generate", "score"):
            if set(tasks) == {task}:
                return task
        return None

    @classmethod
    def engine_args(
        cls, loadtime: Mapping[str, Any], runtime: Mapping[str, Any] | None = None
    ) -> tuple[str, ...]:
        args: list[str] = []
        for option, flag in (
            ("device", "--device"),
            ("threads", "--threads"),
            ("max_batch_size", "--max-batch-size"),
        ):
            if loadtime.get(option) is not None:
                args += [flag, str(loadtime[option])]
        return tuple(args)


class SieTransformersAdapter(TransformersAdapter):
    """An SIE adapter whose models the default engine serves as SIE does.

    ``served_task`` is the one task it serves. ``sie_options`` are SIE's own options of that
    adapter the worker accepts, under loadtime or runtime (runtime wins, as per request in
    SIE); ``engine_options`` are those passed to the engine, ``{option: flag}`` (``normalize``
    false is ``--no-normalize``), with SIE's ``defaults``; the others tune SIE's own kernels
    and have no effect here.
    """

    served_task: ClassVar[Task] = "encode"
    sie_options: ClassVar[tuple[str, ...]] = ()
    engine_options: ClassVar[Mapping[str, str]] = {}
    defaults: ClassVar[Mapping[str, Any]] = {}  # SIE's defaults of engine_options

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # The engine's own options, SIE's options of the adapter, and the keys SIE passes
        # to every adapter (config_kwargs, trust_remote_code, mlx_repo).
        names = (*ENGINE_OPTIONS, *cls.sie_options, *PASSTHROUGH_OPTIONS)
        cls.loadtime_options = tuple(dict.fromkeys(names))

    @classmethod
    def task(cls, tasks: Mapping[str, Any]) -> Task | None:
        return cls.served_task

    @classmethod
    def engine_args(
        cls, loadtime: Mapping[str, Any], runtime: Mapping[str, Any] | None = None
    ) -> tuple[str, ...]:
        args = list(super().engine_args(loadtime, runtime))
        merged = {**cls.defaults, **loadtime, **(runtime or {})}
        for option, flag in cls.engine_options.items():
            value = merged.get(option)
            if value is None:
                continue
            if option == "normalize":
                if value is False:
                    args.append("--no-normalize")
            else:
                args += [flag, str(value)]
        return tuple(args)
