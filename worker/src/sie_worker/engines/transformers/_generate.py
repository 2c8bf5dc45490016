"""Text generation with ``AutoModelForCausalLM``, streamed piece by piece to a sink.

Imported only inside the engine subprocess (imports torch and transformers). Every method
runs on the engine's single model thread; ``generate`` hands each decoded piece to ``sink``
(which crosses to the event loop) and stops early once ``cancel`` is set.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    StoppingCriteria,
    StoppingCriteriaList,
    TextIteratorStreamer,
)

from sie_worker.engines.transformers._device import Placement, torch_dtype
from sie_worker.engines.transformers._errors import EngineError
from sie_worker.engines.transformers._requests import ChatMessage, Sampling, render_chat_fallback

__all__ = ["Generator", "Outcome", "Prepared"]

_log = logging.getLogger("sie_worker.engines")
_DEFAULT_CONTEXT = 2048
_BASE = "__base__"  # peft's name for "no adapter" in adapter_names


@dataclass(frozen=True)
class Prepared:
    input_ids: tuple[int, ...]
    max_new_tokens: int
    adapter: str | None = None  # the LoRA adapter it is generated with (None: the base)


@dataclass(frozen=True)
class Outcome:
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" (EOS, stop string, cancelled) or "length"


class Generator:
    backend = "transformers"

    def __init__(
        self,
        model: str | Path,
        placement: Placement,
        *,
        context_length: int | None,
        local_only: bool,
        revision: str | None,
        loras: tuple[tuple[str, str], ...] = (),
    ) -> None:
        self._device = torch.device(placement.device)
        self._tokenizer: Any = AutoTokenizer.from_pretrained(
            model, local_files_only=local_only, revision=revision
        )
        loaded: Any = AutoModelForCausalLM.from_pretrained(
            model,
            dtype=torch_dtype(placement.dtype),
            local_files_only=local_only,
            revision=revision,
        )
        self._model: Any = loaded.to(self._device).eval()
        defaults = self._model.generation_config
        eos = (
            defaults.eos_token_id
            if defaults.eos_token_id is not None
            else self._tokenizer.eos_token_id
        )
        self._eos: tuple[int, ...] = (
            tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        )
        pad = self._tokenizer.pad_token_id
        self._pad: int | None = pad if pad is not None else (self._eos[0] if self._eos else None)
        self.context_length = (
            context_length or _model_context(self._model.config) or _DEFAULT_CONTEXT
        )
        self.has_chat_template = bool(getattr(self._tokenizer, "chat_template", None))
        self.adapters: tuple[str, ...] = tuple(name for name, _ in loras)
        if loras:
            self._model = _with_adapters(self._model, loras)

    def chat_prompt(self, messages: tuple[ChatMessage, ...]) -> tuple[str, bool]:
        """The prompt text, and whether tokenizing it should add special tokens."""
        if not self.has_chat_template:
            return render_chat_fallback(messages), True
        # why: OpenAI's "developer" role is the system role; older templates only know "system"
        turns = [
            {"role": "system" if m.role == "developer" else m.role, "content": m.content}
            for m in messages
        ]
        try:
            text = self._tokenizer.apply_chat_template(
                turns, add_generation_prompt=True, tokenize=False
            )
        except Exception as exc:  # jinja raises its own TemplateError for refused messages
            raise EngineError(
                f"messages: the model's chat template refused them: {exc}", param="messages"
            ) from exc
        # why: the template already wrote BOS and friends as text
        return str(text), False

    def prepare(
        self,
        prompt: str,
        sampling: Sampling,
        *,
        add_special_tokens: bool,
        adapter: str | None = None,
    ) -> Prepared:
        ids = self._tokenizer(prompt, add_special_tokens=add_special_tokens)["input_ids"]
        if not ids:
            raise EngineError("prompt: is empty after tokenization; send some text", param="prompt")
        room = self.context_length - len(ids)
        if room < 1:
            raise EngineError(
                f"prompt: {len(ids)} tokens leave no room to generate within the context length "
                f"of {self.context_length} tokens; shorten the prompt",
                code="context_length_exceeded",
                param="prompt",
            )
        wanted = sampling.max_tokens if sampling.max_tokens is not None else room
        return Prepared(tuple(ids), min(wanted, room), self._adapter(adapter))

    def _adapter(self, name: str | None) -> str | None:
        """``name`` when this engine serves that adapter (SGLang's 400 otherwise)."""
        if name is None or name in self.adapters:
            return name
        loaded = ", ".join(repr(a) for a in self.adapters) or "none"
        raise EngineError(
            f"lora_path: the following requested LoRA adapters are not loaded: {name}; "
            f"loaded adapters: {loaded}",
            param="lora_path",
        )

    def generate(
        self,
        prepared: Prepared,
        sampling: Sampling,
        sink: Callable[[str], None],
        cancel: threading.Event,
    ) -> Outcome:
        input_ids = torch.tensor([prepared.input_ids], device=self._device)
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        with torch.inference_mode():
            output = self._model.generate(
                input_ids=input_ids,
                attention_mask=torch.ones_like(input_ids),
                **self._sampling_kwargs(prepared, sampling),
                streamer=_SinkStreamer(self._tokenizer, sink),
                stopping_criteria=StoppingCriteriaList([_UntilCancelled(cancel)]),
            )
        new = output[0, input_ids.shape[1] :].tolist()
        hit_length = len(new) >= prepared.max_new_tokens and not (new and new[-1] in self._eos)
        return Outcome(
            prompt_tokens=len(prepared.input_ids),
            completion_tokens=len(new),
            finish_reason="length" if hit_length and not cancel.is_set() else "stop",
        )

    def _sampling_kwargs(self, prepared: Prepared, sampling: Sampling) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "max_new_tokens": prepared.max_new_tokens,
            "do_sample": sampling.temperature > 0.0,
            "pad_token_id": self._pad,
        }
        if self.adapters:
            # why: peft applies each sequence's own adapter (its mixed-batch inference), so
            # requests for different adapters never switch shared state
            kwargs["adapter_names"] = [prepared.adapter or _BASE]
        if self._eos:
            kwargs["eos_token_id"] = list(self._eos)
        if sampling.temperature > 0.0:
            # why: OpenAI semantics (no top-k) rather than the checkpoint's sampling defaults
            kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=0)
        return kwargs


def _with_adapters(model: Any, loras: tuple[tuple[str, str], ...]) -> Any:
    """The model wrapped by peft with every adapter loaded (none active by default: each
    generation names its own, the base being peft's ``__base__``)."""
    from peft import PeftModel

    (first, folder), *rest = loras
    _log.info("loading LoRA adapters %s", ", ".join(name for name, _ in loras))
    wrapped: Any = PeftModel.from_pretrained(model, folder, adapter_name=first, is_trainable=False)
    for name, path in rest:
        wrapped.load_adapter(path, adapter_name=name, is_trainable=False)
    return wrapped.eval()


def _model_context(config: Any) -> int | None:
    text_config = getattr(config, "text_config", None) or config
    value = getattr(text_config, "max_position_embeddings", None)
    return value if isinstance(value, int) and value > 0 else None


class _SinkStreamer(TextIteratorStreamer):
    """Hands each decoded piece to ``sink`` instead of a blocking queue."""

    def __init__(self, tokenizer: Any, sink: Callable[[str], None]) -> None:
        super().__init__(tokenizer, skip_prompt=True, skip_special_tokens=True)
        self._sink = sink

    def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
        if text:
            self._sink(text)


class _UntilCancelled(StoppingCriteria):
    def __init__(self, cancel: threading.Event) -> None:
        self._cancel = cancel

    def __call__(
        self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any
    ) -> torch.Tensor:
        return torch.full(
            (input_ids.shape[0],), self._cancel.is_set(), dtype=torch.bool, device=input_ids.device
        )
