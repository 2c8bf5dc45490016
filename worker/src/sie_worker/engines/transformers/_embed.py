"""Embedding backends: native ``AutoModel`` + pooling, or sentence-transformers for other stacks.

Imported only inside the engine subprocess (imports torch). Every method runs on the
engine's single model thread.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch

from sie_worker.engines.transformers._device import Placement, torch_dtype
from sie_worker.engines.transformers._pooling import PoolingMode, PoolingPlan, pooling_plan

__all__ = ["Embedder", "load_embedder"]


class Embedder(Protocol):
    dimensions: int
    backend: str
    max_length: int
    prompts: Mapping[str, str]  # sentence-transformers prompts by name ("query", "document")

    def embed(
        self, texts: Sequence[str], *, normalize: bool = True, shaped: bool = False
    ) -> tuple[list[list[float]], int]:
        """One vector per text (L2-normalised unless told not to), and the tokens read.
        ``shaped``: the texts already carry their prompt (no default prompt is added)."""
        ...


def load_embedder(
    model_dir: Path, placement: Placement, *, batch_size: int, max_length: int | None
) -> Embedder:
    """``max_length`` (``--context-length``) caps the tokens read per input; longer inputs
    are truncated, as sentence-transformers does."""
    plan = pooling_plan(model_dir)
    embedder: Embedder
    if plan is None:
        embedder = _SentenceTransformersEmbedder(
            model_dir, placement, batch_size=batch_size, max_length=max_length
        )
    else:
        embedder = _NativeEmbedder(
            model_dir, plan, placement, batch_size=batch_size, max_length=max_length
        )
    embedder.prompts = _prompts(model_dir)
    return embedder


def _prompts(model_dir: Path) -> dict[str, str]:
    """The prompts a sentence-transformers directory declares (``prompts`` of
    ``config_sentence_transformers.json``)."""
    try:
        config = json.loads((model_dir / "config_sentence_transformers.json").read_text())
    except (OSError, ValueError):
        return {}
    prompts = config.get("prompts") if isinstance(config, dict) else None
    if not isinstance(prompts, dict):
        return {}
    return {k: v for k, v in prompts.items() if isinstance(k, str) and isinstance(v, str) and v}


class _NativeEmbedder:
    backend = "transformers"
    prompts: Mapping[str, str] = {}

    def __init__(
        self,
        model_dir: Path,
        plan: PoolingPlan,
        placement: Placement,
        *,
        batch_size: int,
        max_length: int | None,
    ) -> None:
        from transformers import AutoModel, AutoTokenizer

        self._plan = plan
        self._batch_size = batch_size
        self._device = torch.device(placement.device)
        self._tokenizer: Any = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        model: Any = AutoModel.from_pretrained(
            model_dir, dtype=torch_dtype(placement.dtype), local_files_only=True
        )
        self._model: Any = model.to(self._device).eval()
        config = self._model.config
        self.dimensions = int(config.hidden_size)
        limits = [
            n
            for n in (
                plan.max_seq_length,
                getattr(config, "max_position_embeddings", None),
                self._tokenizer.model_max_length,
            )
            if isinstance(n, int) and 0 < n < 1_000_000
        ]
        own = plan.max_seq_length or min(limits, default=512)
        self.max_length = min(own, max_length) if max_length else own
        # why: some tokenizers emit token_type_ids that the model's forward does not take
        self._accepted = set(inspect.signature(self._model.forward).parameters)

    def embed(
        self, texts: Sequence[str], *, normalize: bool = True, shaped: bool = False
    ) -> tuple[list[list[float]], int]:
        inputs = [t.lower() for t in texts] if self._plan.lowercase else list(texts)
        vectors: list[list[float]] = []
        tokens = 0
        with torch.inference_mode():
            for start in range(0, len(inputs), self._batch_size):
                encoded = self._tokenizer(
                    inputs[start : start + self._batch_size],
                    padding=True,
                    truncation=True,
                    max_length=self.max_length,
                    return_tensors="pt",
                )
                feed = {k: v.to(self._device) for k, v in encoded.items() if k in self._accepted}
                states = self._model(**feed).last_hidden_state
                mask = feed["attention_mask"]
                tokens += int(mask.sum().item())
                pooled = _pool(states, mask, self._plan.mode, self._tokenizer.padding_side)
                pooled = pooled.float()
                if normalize:
                    pooled = torch.nn.functional.normalize(pooled, p=2.0, dim=1)
                vectors.extend(pooled.cpu().tolist())
        return vectors, tokens


def _pool(
    states: torch.Tensor, mask: torch.Tensor, mode: PoolingMode, padding_side: str
) -> torch.Tensor:
    weights = mask.unsqueeze(-1).to(states.dtype)
    if mode == "cls":
        return states[:, 0]
    if mode == "max":
        return states.masked_fill(weights == 0, -1e9).max(dim=1).values
    if mode == "lasttoken":
        if padding_side == "left":
            return states[:, -1]
        last = mask.sum(dim=1) - 1
        return states[torch.arange(states.shape[0], device=states.device), last]
    total = (states * weights).sum(dim=1)
    counts = weights.sum(dim=1).clamp(min=1e-9)
    return total / (counts.sqrt() if mode == "mean_sqrt_len" else counts)


class _SentenceTransformersEmbedder:
    backend = "sentence-transformers"
    prompts: Mapping[str, str] = {}

    def __init__(
        self, model_dir: Path, placement: Placement, *, batch_size: int, max_length: int | None
    ) -> None:
        from sentence_transformers import SentenceTransformer

        model_kwargs = (
            None if placement.dtype == "auto" else {"dtype": torch_dtype(placement.dtype)}
        )
        self._model: Any = SentenceTransformer(
            str(model_dir),
            device=placement.device,
            local_files_only=True,
            model_kwargs=model_kwargs,
        )
        self._batch_size = batch_size
        dimension = self._model.get_embedding_dimension()
        # why: a stack that does not declare its width still tells it by embedding once
        self.dimensions = int(dimension) if dimension else len(self._model.encode(["probe"])[0])
        if max_length and (
            not self._model.max_seq_length or max_length < self._model.max_seq_length
        ):
            self._model.max_seq_length = max_length
        self.max_length = int(self._model.max_seq_length or 0)

    def embed(
        self, texts: Sequence[str], *, normalize: bool = True, shaped: bool = False
    ) -> tuple[list[list[float]], int]:
        vectors = self._model.encode(
            list(texts),
            # why: "" stops sentence-transformers adding its default prompt a second time
            prompt="" if shaped else None,
            batch_size=self._batch_size,
            normalize_embeddings=normalize,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        features = self._model.tokenize(list(texts))
        tokens = int(features["attention_mask"].sum().item()) if "attention_mask" in features else 0
        rows: list[list[float]] = vectors.tolist()
        return rows, tokens
