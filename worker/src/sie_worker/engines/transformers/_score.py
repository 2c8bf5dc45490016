"""Cross-encoder scoring: one relevance score per (query, document) pair.

Imported only inside the engine subprocess (imports torch). The model is an
``AutoModelForSequenceClassification`` with one label; its logit goes through the activation
sentence-transformers' ``CrossEncoder`` would use (``sentence_transformers.activation_fn``
in ``config.json``, else ``sbert_ce_default_activation_function``, else sigmoid), as SIE's
cross-encoder adapters score. Pairs longer than the model's limit are truncated.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from sie_worker.engines.transformers._device import Placement, StartupError, torch_dtype

__all__ = ["Scorer", "activation_of"]

_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "Sigmoid": torch.sigmoid,
    "Identity": lambda x: x,
    "Tanh": torch.tanh,
}


def activation_of(config: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """The activation of a cross-encoder's logit, from its transformers config."""
    st = getattr(config, "sentence_transformers", None)
    named = st.get("activation_fn") if isinstance(st, dict) else None
    named = named or getattr(config, "sbert_ce_default_activation_function", None)
    if not named:
        return torch.sigmoid
    short = str(named).rsplit(".", 1)[-1]
    if short not in _ACTIVATIONS:
        raise StartupError(
            f"the model's activation {named!r} is not supported for scoring; "
            f"supported: {', '.join(_ACTIVATIONS)}"
        )
    return _ACTIVATIONS[short]


class Scorer:
    backend = "transformers"

    def __init__(
        self, model_dir: Path, placement: Placement, *, batch_size: int, max_length: int | None
    ) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self._batch_size = batch_size
        self._device = torch.device(placement.device)
        self._tokenizer: Any = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        model: Any = AutoModelForSequenceClassification.from_pretrained(
            model_dir, dtype=torch_dtype(placement.dtype), local_files_only=True
        )
        config = model.config
        if int(getattr(config, "num_labels", 1)) != 1:
            raise StartupError(
                f"task score needs a cross-encoder with one output label; this model has "
                f"{config.num_labels} (num_labels in config.json)"
            )
        self._activation = activation_of(config)
        self._model: Any = model.to(self._device).eval()
        limits = [
            n
            for n in (
                getattr(config, "max_position_embeddings", None),
                self._tokenizer.model_max_length,
            )
            if isinstance(n, int) and 0 < n < 1_000_000
        ]
        own = min(limits, default=512)
        self.max_length = min(own, max_length) if max_length else own
        self._accepted = set(inspect.signature(self._model.forward).parameters)

    def score(self, query: str, documents: Sequence[str]) -> tuple[list[float], list[int]]:
        """A score per document, and the tokens each pair read."""
        scores: list[float] = []
        tokens: list[int] = []
        with torch.inference_mode():
            for start in range(0, len(documents), self._batch_size):
                batch = list(documents[start : start + self._batch_size])
                encoded = self._tokenizer(
                    [query] * len(batch),
                    batch,
                    padding=True,
                    truncation=True,
                    max_length=self.max_length,
                    return_tensors="pt",
                )
                feed = {k: v.to(self._device) for k, v in encoded.items() if k in self._accepted}
                logits = self._model(**feed).logits[:, 0].float()
                scores.extend(self._activation(logits).cpu().tolist())
                tokens.extend(int(n) for n in feed["attention_mask"].sum(dim=1).tolist())
        return scores, tokens
