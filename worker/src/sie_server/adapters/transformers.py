"""``sie_server.adapters.transformers:TransformersAdapter``: the CPU / single-GPU default.

Runs ``python -m sie_worker.engines.transformers``: one process on one device, so it refuses
``tensor_parallel_size`` when the model loads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from sie_server.adapters.base import Adapter, EngineKind, Task

__all__ = ["TransformersAdapter"]


class TransformersAdapter(Adapter):
    """Embeddings, cross-encoder scores or generation with transformers /
    sentence-transformers on one device."""

    engine: ClassVar[EngineKind] = "transformers"
    loadtime_options = (
        "request_read_timeout_s",
        "startup_timeout_s",
        "device",
        "threads",
        "max_batch_size",
    )

    @classmethod
    def task(cls, tasks: Mapping[str, Any]) -> Task | None:
        # One engine serves one task; a config declaring several is refused at load time.
        for task in ("encode", "generate", "score"):
            if set(tasks) == {task}:
                return task
        return None

    @classmethod
    def engine_args(cls, loadtime: Mapping[str, Any]) -> tuple[str, ...]:
        args: list[str] = []
        for option, flag in (
            ("device", "--device"),
            ("threads", "--threads"),
            ("max_batch_size", "--max-batch-size"),
        ):
            if loadtime.get(option) is not None:
                args += [flag, str(loadtime[option])]
        return tuple(args)
