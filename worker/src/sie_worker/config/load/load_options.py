"""What a load resolves a profile to (:class:`LoadOptions`), and what is read off a profile
without the load-time checks: its adapter, its declared width and its engine's context
length. :mod:`sie_worker.config.load.loadtime` checks and fills the options."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sie_server.adapters.base import Adapter
from sie_worker.config.adapters import default_adapter_path, resolve_adapter
from sie_worker.config.lora import LoraAdapter
from sie_worker.config.model import ServedModel
from sie_worker.config.widths import model_width, stages_problem, width_problem
from sie_worker.settings import Settings

__all__ = ["LoadOptions", "adapter_of", "context_length", "declared_width"]


@dataclass(frozen=True)
class LoadOptions:
    width: int  # the model's whole width: tensor_parallel_size x pipeline_parallel_size
    request_read_timeout_s: float | None
    startup_timeout_s: float
    watchdog_timeout_s: float | None
    disable_piecewise_cuda_graph: bool
    nccl_port: int | None  # declared; None -> worker picks from 30400-30499
    extras: Mapping[str, Any]  # adapter-specific accepted options (chat_template, threads, ...)
    disable_cuda_graph: bool = False  # loadtime option, or --disable-cuda-graph in extra args
    adapter: str = ""  # the resolved adapter_path (bundle default applied)
    task: str | None = None  # "generate", "encode" or "score"
    declared: Mapping[str, Any] = field(default_factory=dict)  # the loadtime block as written
    model_path: str | None = None  # model_path resolved to a local directory; None: use hf_id
    engine_version: str | None = None  # the engine release the argv is built for
    context_length: int | None = None  # --context-length (None: the model's config.json)
    warnings: tuple[str, ...] = ()  # accepted options this worker does not apply
    # LoRA adapters (lora_paths), local sources resolved to absolute folders; hub ones stay
    # repo ids until the worker fetches them (then their snapshot folders).
    loras: tuple[LoraAdapter, ...] = ()
    max_loras_per_batch: int | None = None  # with loras: declared, else SIE's default
    stages: int = 1  # pipeline_parallel_size
    # Devices this worker claims: the width, or width / SIE_NODES for a model served by a
    # group of nodes (one wider than the worker's devices).
    local_width: int | None = None

    @property
    def tensor_width(self) -> int:
        """``tensor_parallel_size``: the engine's tensor-parallel flag."""
        return self.width // self.stages

    @property
    def claim_width(self) -> int:
        """The devices this worker claims for the model."""
        return self.width if self.local_width is None else self.local_width

    @property
    def grouped(self) -> bool:
        """Whether a group of nodes serves the model (this worker runs one rank of it)."""
        return self.local_width is not None and self.local_width != self.width


def adapter_of(served: ServedModel, settings: Settings) -> type[Adapter]:
    """The profile's adapter, or the bundle's default one. Raises :class:`UnknownAdapter` or
    :class:`NotServedHere`."""
    path = served.profile.adapter_path or default_adapter_path(settings.engine, served.config.tasks)
    return resolve_adapter(path)


def declared_width(served: ServedModel) -> int:
    """The width the profile declares, tensor_parallel_size x pipeline_parallel_size (each 1
    when absent or invalid); no load-time checks."""
    loadtime = served.profile.loadtime
    tensor = loadtime.get("tensor_parallel_size", 1)
    stages = loadtime.get("pipeline_parallel_size", 1)
    return model_width(
        tensor if width_problem(tensor) is None else 1,
        stages if stages_problem(stages) is None else 1,
    )


def context_length(served: ServedModel, adapter: type[Adapter]) -> int | None:
    """The engine's context length: ``loadtime.max_seq_length`` (``max_length`` for SIE's
    CrossEncoderAdapter), else the top-level ``max_sequence_length``, else (generation)
    ``tasks.generate.context_length``, else None (the engine reads the model's config.json).
    SIE passes the literal ``None`` in the last case, which SGLang refuses."""
    loadtime, config = served.profile.loadtime, served.config
    for key in ("max_seq_length", "max_length"):
        value = loadtime.get(key)
        if (
            isinstance(value, int)
            and not isinstance(value, bool)
            and key in adapter.loadtime_options
        ):
            return value
    generates = adapter.task(config.tasks) == "generate"
    # The earlier spelling, tasks.encode.max_sequence_length, only ever bounded embeddings.
    earlier = config.path_of("max_sequence_length") == ("tasks", "encode", "max_sequence_length")
    if config.max_sequence_length is not None and not (generates and earlier):
        return config.max_sequence_length
    if generates:
        value = config.generate.get("context_length")
        return value if isinstance(value, int) else None
    return None
