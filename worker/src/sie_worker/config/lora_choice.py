"""Which LoRA adapter a request names, as SGLang's and SIE's clients name it. Pure.

- OpenAI routes: SGLang's ``model: "<served id>:<adapter>"`` (a served id as written wins,
  so ``sie_id:profile`` still names a profile; else the longest served id followed by ``:``),
  SGLang's ``lora_path`` field, and sie-sdk's ``lora_adapter`` (an alias of ``lora_path``);
  the ``model`` suffix wins over the fields, as in SGLang;
- SIE's native routes: ``lora_adapter`` on ``/v1/generate``, ``params.options.lora`` /
  ``lora_id`` on ``/v1/encode`` (:mod:`sie_worker.sie_api`).

Which served id ``model:adapter`` names is the model-id rule's
(:func:`sie_worker.sie_api.ids.split_model`, for worker, router and gateway alike).

The engine gets the adapter as SGLang's ``lora_path`` (the default engine reads it too). An
adapter the served model does not declare is :class:`~sie_worker.errors.UnknownModel` (404)
naming the adapters it has; requests without one are served by the base.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sie_worker.config.lora import BASE_ADAPTER, adapter_names
from sie_worker.config.model import ServedModel
from sie_worker.errors import InvalidRequest, UnknownModel

__all__ = [
    "ADAPTER_FIELD",
    "ADAPTER_FIELDS",
    "adapter_label",
    "check_adapter",
    "request_adapter",
    "unknown_adapter",
]

ADAPTER_FIELD = "lora_path"  # SGLang's request field, what the engines read
# The OpenAI request fields that may name an adapter (sie-sdk's alias second).
ADAPTER_FIELDS = (ADAPTER_FIELD, "lora_adapter")


def request_adapter(payload: Mapping[str, Any], from_model: str | None) -> str | None:
    """The adapter an OpenAI request names: the ``model`` suffix, else ``lora_path``, else
    ``lora_adapter`` (both fields: they must agree). :class:`InvalidRequest` for a field
    that is not a nonempty string."""
    fields: dict[str, str] = {}
    for key in ADAPTER_FIELDS:
        value = payload.get(key)
        if value is None:
            continue
        if not isinstance(value, str) or not value.strip():
            raise InvalidRequest(
                f"{key}: must be the name of one of the model's LoRA adapters (a nonempty "
                "string; GET /v1/models lists them), or left out for the base model",
                param=key,
            )
        fields[key] = value.strip()
    if from_model is not None:
        return from_model
    if len(set(fields.values())) > 1:
        raise InvalidRequest(
            f"lora_path ({fields[ADAPTER_FIELD]!r}) and lora_adapter "
            f"({fields['lora_adapter']!r}) name different adapters; send one",
            param="lora_adapter",
        )
    return next(iter(fields.values()), None)


def check_adapter(served: ServedModel, name: str, *, param: str = ADAPTER_FIELD) -> str:
    """``name`` when ``served`` declares that adapter, else :class:`UnknownModel` naming
    the adapters it has."""
    names = adapter_names(served.profile.loadtime)
    if name in names:
        return name
    raise unknown_adapter(served.id, names, name, param=param)


def unknown_adapter(
    served_id: str, names: Sequence[str], name: str, *, param: str = ADAPTER_FIELD
) -> UnknownModel:
    """The refusal of adapter ``name``, which the served model (declaring ``names``) lacks."""
    has = (
        "its adapters: " + ", ".join(names)
        if names
        else "it declares no LoRA adapters (adapter_options.loadtime.lora_paths)"
    )
    return UnknownModel(
        f"{served_id} has no LoRA adapter {name!r} ({has}); GET /v1/models lists them",
        param=param,
    )


def adapter_label(served: ServedModel, name: str | None) -> str:
    """The metrics label of a request's adapter: a declared name, else ``none`` (bounded
    by the config, whatever clients send)."""
    if name is not None and name in adapter_names(served.profile.loadtime):
        return name
    return BASE_ADAPTER
