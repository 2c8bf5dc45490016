"""What the engine holds: its options, its loaded model, and where loading stands.

Loading runs on the model thread while the HTTP server already answers ``/health`` with
503; :func:`load` fills the state in and flips it to ready.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from sie_worker.engines.transformers._device import (
    Placement,
    StartupError,
    cap_cuda_memory,
    resolve_placement,
)
from sie_worker.engines.transformers._options import EngineOptions

if TYPE_CHECKING:
    from sie_worker.engines.transformers._embed import Embedder
    from sie_worker.engines.transformers._generate import Generator
    from sie_worker.engines.transformers._score import Scorer

__all__ = ["EngineState", "load"]

_log = logging.getLogger("sie_worker.engines")
_PATH_PREFIXES = ("/", "./", "../", "~")


@dataclass
class EngineState:
    options: EngineOptions
    status: Literal["loading", "ready", "failed"] = "loading"
    placement: Placement | None = None
    embedder: Embedder | None = None
    generator: Generator | None = None
    scorer: Scorer | None = None
    error: str | None = None
    load_seconds: float | None = None
    created: int = field(default_factory=lambda: int(time.time()))

    def describe(self) -> dict[str, Any]:
        """Metadata for ``/health`` and ``/v1/models``: where the model runs and how."""
        info: dict[str, Any] = {
            "task": self.options.task,
            "root": self.options.model_path,
            "device": self.placement.device if self.placement else None,
            "dtype": self.placement.dtype if self.placement else None,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "state": self.status,
        }
        if self.embedder is not None:
            info.update(
                backend=self.embedder.backend,
                dimensions=self.embedder.dimensions,
                max_model_len=self.embedder.max_length,
            )
        if self.scorer is not None:
            info.update(backend=self.scorer.backend, max_model_len=self.scorer.max_length)
        if self.generator is not None:
            info.update(
                backend=self.generator.backend,
                max_model_len=self.generator.context_length,
                chat_template=self.generator.has_chat_template,
                lora_adapters=list(self.generator.adapters),
            )
        if self.error:
            info["error"] = self.error
        return info


def load(state: EngineState) -> None:
    """Load the model named by the options (on the model thread); raises on failure."""
    options = state.options
    started = time.monotonic()
    local = _local_dir(options.model_path)
    placement = resolve_placement(options.device, options.dtype)
    cap_cuda_memory(placement, options.cuda_memory_fraction)
    _log.info(
        "loading %s (task %s) on %s as %s",
        options.model_path,
        options.task,
        placement.device,
        placement.dtype,
    )
    if options.task == "encode":
        from sie_worker.engines.transformers._embed import load_embedder

        model_dir = local or _snapshot(options.model_path, options.revision)
        state.embedder = load_embedder(
            model_dir,
            placement,
            batch_size=options.max_batch_size,
            max_length=options.context_length,
        )
    elif options.task == "score":
        from sie_worker.engines.transformers._score import Scorer

        state.scorer = Scorer(
            local or _snapshot(options.model_path, options.revision),
            placement,
            batch_size=options.max_batch_size,
            max_length=options.context_length,
        )
    else:
        from sie_worker.engines.transformers._generate import Generator

        state.generator = Generator(
            local or options.model_path,
            placement,
            context_length=options.context_length,
            local_only=local is not None,
            revision=None if local else options.revision,
            loras=options.loras,
        )
    state.placement = placement
    state.load_seconds = time.monotonic() - started
    state.status = "ready"
    _log.info("model %s ready in %.2fs", options.served_model_name, state.load_seconds)


def _local_dir(model_path: str) -> Path | None:
    path = Path(model_path).expanduser()
    if path.is_dir():
        return path.resolve()
    if model_path.startswith(_PATH_PREFIXES) or path.exists():
        raise StartupError(
            f"--model-path {model_path}: no such model directory; pass a directory holding "
            "config.json, or a Hugging Face id"
        )
    return None


def _snapshot(repo_id: str, revision: str | None) -> Path:
    # why: sentence-transformers stacks are read from files; a hub id is resolved to its
    # snapshot directory first (from the cache only when HF_HUB_OFFLINE=1)
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(repo_id, revision=revision))
