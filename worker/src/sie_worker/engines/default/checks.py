"""Load-time checks of the transformers engine's adapters (``TransformersAdapter`` and the
SIE adapters it serves, :class:`~sie_server.adapters.transformers.SieTransformersAdapter`).

- ``device`` is auto, cpu or cuda; ``threads`` and ``max_batch_size`` integers >= 1;
  ``memory_gib`` (what the model reserves on its device) a number above 0;
- encode makes dense vectors only: ``tasks.encode.sparse`` / ``.multivector`` are refused;
- SIE's options, under loadtime or runtime: ``pooling`` (cls or mean for SIE's flash
  adapters), ``normalize`` (true/false), the templates and instructions (strings), lengths
  (integers >= 1); ``trust_remote_code: true`` is refused (the engine runs no repository
  code); ``lora_id`` is refused (the default engine serves LoRA adapters for generation, from
  ``lora_paths``); ``output_types`` other than dense are refused;
- ``lora_paths`` / ``max_loras_per_batch`` only on a model that generates.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sie_server.adapters.base import Adapter
from sie_server.adapters.transformers import SieTransformersAdapter
from sie_worker.config.files.values import described
from sie_worker.config.model import JsonPath, ServedModel

__all__ = ["DEVICES", "FLASH_POOLING", "DefaultChecks", "transformers_problems"]

DEVICES = ("auto", "cpu", "cuda")
FLASH_POOLING = ("cls", "mean")
_TEXT = ("query_template", "doc_template", "default_instruction", "instruction")
_LENGTHS = ("max_seq_length", "max_length")

Where = str | JsonPath


def transformers_problems(
    adapter: type[Adapter], served: ServedModel, extras: Mapping[str, Any]
) -> list[tuple[Where, str]]:
    """Problems of one transformers-engine profile (``extras``: its accepted loadtime options
    beyond the timeouts). Loadtime keys are reported by name, the rest by full path."""
    found: list[tuple[Where, str]] = []
    if "device" in extras and extras["device"] not in DEVICES:
        got = described(extras["device"])
        found.append(("device", f"must be one of {', '.join(DEVICES)}, got {got}"))
    for key in ("threads", "max_batch_size"):
        value = extras.get(key)
        if key in extras and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            found.append((key, f"must be an integer of at least 1, got {described(value)}"))
    if "memory_gib" in extras:
        value = extras["memory_gib"]
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 2**20:
            found.append(
                (
                    "memory_gib",
                    f"must be a number of GiB above 0, e.g. 2.5, got {described(value)}",
                )
            )
    task = adapter.task(served.config.tasks)
    for key in ("lora_paths", "max_loras_per_batch"):
        if key in extras and task != "generate":
            found.append(
                (
                    key,
                    f"the default engine serves LoRA adapters for generation only, and this "
                    f"model serves {task}: remove it, or serve the model with an SGLang adapter",
                )
            )
    encode = served.config.tasks.get("encode") or {}
    if adapter.task(served.config.tasks) == "encode":
        for kind in ("sparse", "multivector"):
            if encode.get(kind) is not None:
                found.append(
                    (
                        ("tasks", "encode", kind),
                        f"{adapter.__name__} makes dense vectors only; remove {kind}, or serve "
                        "the model with SIE's own image",
                    )
                )
    if issubclass(adapter, SieTransformersAdapter):
        found += _sie_problems(adapter, served, extras)
    return found


def _sie_problems(
    adapter: type[SieTransformersAdapter], served: ServedModel, extras: Mapping[str, Any]
) -> list[tuple[Where, str]]:
    profile = served.profile
    runtime_base: JsonPath = ("profiles", profile.runtime_from, "adapter_options", "runtime")
    found: list[tuple[Where, str]] = []
    if extras.get("trust_remote_code") is True:
        found.append(
            (
                "trust_remote_code",
                "the default engine does not run a repository's own code: remove it (the model "
                "then loads with transformers' built-in classes), or serve the model with SIE's "
                "own image",
            )
        )
    sources: list[tuple[Mapping[str, Any], Any]] = [(extras, None), (profile.runtime, runtime_base)]
    for options, base in sources:
        for key, value in options.items():
            where: Where = key if base is None else (*base, key)
            message = _value_problem(adapter, key, value)
            if message is not None:
                found.append((where, message))
    return found


def _value_problem(adapter: type[SieTransformersAdapter], key: str, value: Any) -> str | None:
    if key == "pooling" and "pooling" in adapter.engine_options and value not in FLASH_POOLING:
        choices = ", ".join(FLASH_POOLING)
        return f"must be one of {choices} for {adapter.__name__}, got {described(value)}"
    if key == "normalize" and not isinstance(value, bool):
        return f"must be true or false, got {described(value)}"
    if key in _TEXT and not isinstance(value, str):
        return f"must be a string, got {described(value)}"
    if key in _LENGTHS and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        return f"must be an integer of at least 1, got {described(value)}"
    if key == "lora_id":
        return (
            "a profile-wide embedding adapter is not served by the default engine (it serves "
            "LoRA adapters for generation, from loadtime.lora_paths); remove it, or serve the "
            "model with SIE's own image"
        )
    if key == "output_types" and value not in (["dense"], None):
        return f"the default engine makes dense vectors only, got {described(value)}"
    return None


class DefaultChecks:
    """The default engine's checks of one load (:func:`transformers_problems`), as the
    engine protocol asks for them."""

    def __init__(
        self, adapter: type[Adapter], served: ServedModel, extras: Mapping[str, Any]
    ) -> None:
        self.warnings: list[str] = []
        self._found = transformers_problems(adapter, served, extras)

    def problems(self) -> list[tuple[Where, str]]:
        return list(self._found)
