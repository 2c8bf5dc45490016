"""SIE's view of the served models: ``ModelInfo`` for ``/v1/models`` (its ``models`` list,
one entry per config, beside the OpenAI ``data``) and ``GET /v1/models/{model}``. Pure.

States in SIE's words: ``unloaded`` -> ``available``, ``loading``, ``ready`` -> ``loaded``,
``failed``. A config's entry takes the furthest state of its served models (a profile
loaded makes the model loaded), each profile's own state is in ``profiles``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sie_worker.config.lora import adapter_names
from sie_worker.config.model import DEFAULT_PROFILE, ModelConfig, served_models
from sie_worker.model_states import ModelState, parse_state, progress

__all__ = [
    "SIE_STATES",
    "describes",
    "merge_model_infos",
    "model_detail",
    "model_info",
    "model_infos",
    "sie_state",
]

SIE_STATES: Mapping[ModelState, str] = {
    "unloaded": "available",
    "loading": "loading",
    "ready": "loaded",
    "failed": "failed",
}
_OUR_STATES = {word: state for state, word in SIE_STATES.items()}
_INPUTS = ("text", "image", "audio", "video", "document")
_ENCODE_OUTPUTS = ("dense", "sparse", "multivector")


def sie_state(state: object) -> str:
    return SIE_STATES[parse_state(state)]


def model_info(
    config: ModelConfig, states: Mapping[str, tuple[ModelState, str | None]]
) -> dict[str, Any]:
    """``config``'s ModelInfo; ``states`` holds each served id's state and error."""
    profiles: dict[str, Any] = {}
    furthest: tuple[ModelState, str | None] = ("unloaded", None)
    for served in served_models(config):
        state, error = states.get(served.id, ("unloaded", None))
        profiles[served.profile.name] = {
            "is_default": served.profile.name == DEFAULT_PROFILE,
            "state": SIE_STATES[state],
        }
        if progress(state) > progress(furthest[0]):
            furthest = (state, error)
    state, error = furthest
    return {
        "name": config.sie_id,
        "loaded": state == "ready",
        "state": SIE_STATES[state],
        "last_error": _last_error(error) if state == "failed" else None,
        "inputs": _inputs(config),
        "outputs": _outputs(config),
        "dims": _dims(config),
        "max_sequence_length": _max_sequence_length(config),
        "revision": config.revision,
        "profiles": profiles,
        "capabilities": _capabilities(config),
        "routing": {"policy": None, "upstream_kind": None},
        "aliases": [],
    }


def model_infos(
    configs: Iterable[ModelConfig], states: Mapping[str, tuple[ModelState, str | None]]
) -> list[dict[str, Any]]:
    return [model_info(c, states) for c in configs]


def model_detail(entry: Mapping[str, Any], info: Mapping[str, Any]) -> dict[str, Any]:
    """``GET /v1/models/{id}``: the served model's ``/v1/models`` entry and its config's
    ModelInfo in one object. ``state`` and ``loaded`` are this served model's, in SIE's
    words (what sie-sdk's ``get_model`` reads); its state in ours is ``worker_state``."""
    state = parse_state(entry.get("state"))
    detail = {**entry, **info}
    detail.update(state=SIE_STATES[state], loaded=state == "ready", worker_state=state)
    if state != "failed":
        detail["last_error"] = None
    elif info.get("last_error") is None:
        detail["last_error"] = _last_error(entry.get("error"))
    return detail


def merge_model_infos(lists: Iterable[Iterable[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """Several workers' ``models`` lists as one: per name the furthest state, and per
    profile too (the slot router's and the gateway's merged views)."""
    merged: dict[str, dict[str, Any]] = {}
    for infos in lists:
        for info in infos:
            name = info.get("name")
            if not isinstance(name, str):
                continue
            seen = merged.get(name)
            if seen is None:
                merged[name] = {**info, "profiles": dict(info.get("profiles") or {})}
                continue
            if _progress(info) > _progress(seen):
                merged[name] = {**info, "profiles": seen["profiles"]}
            profiles = merged[name]["profiles"]
            for profile, detail in (info.get("profiles") or {}).items():
                if profile not in profiles or _progress(detail) > _progress(profiles[profile]):
                    profiles[profile] = detail
    return list(merged.values())


def _progress(info: Mapping[str, Any]) -> int:
    return progress(_OUR_STATES.get(str(info.get("state")), "unloaded"))


def _last_error(error: object) -> dict[str, Any]:
    return {
        "code": "ENGINE",
        "message": str(error or "the model failed to load"),
        "attempts": 1,
        "permanent": False,
    }


def _inputs(config: ModelConfig) -> list[str]:
    declared = config.raw.get("inputs")
    if isinstance(declared, Mapping):
        return [k for k in _INPUTS if declared.get(k, k == "text") is True]
    return ["text"]


def _outputs(config: ModelConfig) -> list[str]:
    tasks = config.tasks
    outputs: list[str] = []
    if "encode" in tasks:
        encode = tasks["encode"] or {}
        kinds = [k for k in _ENCODE_OUTPUTS if encode.get(k) is not None]
        outputs += kinds or ["dense"]
    for task, output in (("score", "score"), ("extract", "json"), ("generate", "tokens")):
        if task in tasks:
            outputs.append(output)
    return outputs


def _dims(config: ModelConfig) -> dict[str, int]:
    encode = config.tasks.get("encode") or {}
    dims: dict[str, int] = {}
    for kind in _ENCODE_OUTPUTS:
        declared = encode.get(kind)
        if isinstance(declared, Mapping) and isinstance(declared.get("dim"), int):
            dims[kind] = declared["dim"]
    if "dense" not in dims and isinstance(encode.get("dimensions"), int):
        dims["dense"] = encode["dimensions"]
    return dims


def _max_sequence_length(config: ModelConfig) -> int | None:
    for value in (
        config.raw.get("max_sequence_length"),
        (config.tasks.get("encode") or {}).get("max_sequence_length"),
        (config.tasks.get("generate") or {}).get("context_length"),
    ):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _capabilities(config: ModelConfig) -> dict[str, Any] | None:
    generate = config.tasks.get("generate")
    if generate is None:
        return None
    declared = generate.get("capabilities") or {}
    capabilities: dict[str, Any] = {
        "streaming": declared.get("streaming", True),
        "grammar": list(declared.get("grammar") or []),
        "tools": declared.get("tools", False),
        "code": declared.get("code", False),
        "sql": declared.get("sql", False),
        "guard": declared.get("guard", False),
    }
    # As SIE's gateway lists them: every profile's adapters, and the union.
    per_profile = {
        name: list(adapter_names(profile.loadtime))
        for name, profile in config.profiles.items()
        if adapter_names(profile.loadtime)
    }
    if per_profile:
        union = [n for names in per_profile.values() for n in names]
        capabilities["lora_adapters"] = list(dict.fromkeys(union))
        capabilities["profile_lora_adapters"] = per_profile
    return capabilities


def describes(info: dict[str, Any], model_id: str) -> bool:
    """Whether SIE's ModelInfo ``info`` is the config of served model ``model_id``."""
    name = info.get("name")
    if name == model_id:
        return True
    profiles = info.get("profiles")
    return (
        isinstance(name, str)
        and isinstance(profiles, dict)
        and any(model_id == f"{name}:{p}" for p in profiles)
    )
