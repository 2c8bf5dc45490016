"""A model config as the worker holds it once read: the config, its resolved profiles, and
the served models it names (``<sie_id>`` for the default profile, ``<sie_id>:<profile>``
for each other one)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_PROFILE",
    "ModelConfig",
    "Profile",
    "ServedModel",
    "served_model",
    "served_models",
]

DEFAULT_PROFILE = "default"


@dataclass(frozen=True)
class Profile:
    name: str
    extends: str | None
    max_batch_tokens: int | None
    compute_precision: str | None
    kv_budget_tokens: int | None
    adapter_path: str | None  # None -> bundle default (see adapters.py)
    loadtime: Mapping[str, Any]  # after extends resolution
    runtime: Mapping[str, Any]
    extra_launch_args: tuple[str, ...]
    extra_env: Mapping[str, str]
    loadtime_from: str = DEFAULT_PROFILE  # the profile whose loadtime block this is (paths)


@dataclass(frozen=True)
class ModelConfig:
    sie_id: str
    hf_id: str
    revision: str | None
    model_path: str | None  # as written: local dir (relative to base_dir) or package:mod/sub
    tasks: Mapping[str, Mapping[str, Any]]
    profiles: Mapping[str, Profile]  # resolved (extends applied), "default" always present
    grammar_profile: str | None
    source: str | None  # file path or "<request>"
    raw: Mapping[str, Any]  # the document as read
    base_dir: Path | None = None  # where a relative model_path starts (the file's folder)


@dataclass(frozen=True)
class ServedModel:
    """One served model id: ``sie_id`` for the default profile, else ``<sie_id>:<profile>``."""

    id: str
    config: ModelConfig
    profile: Profile


def served_models(config: ModelConfig) -> list[ServedModel]:
    """The default profile as ``sie_id``, then every other profile as ``<sie_id>:<profile>``."""
    return [served_model(config, name) for name in config.profiles]


def served_model(config: ModelConfig, profile: str) -> ServedModel:
    """The served model of one profile; KeyError names the profiles when it does not exist."""
    if profile not in config.profiles:
        raise KeyError(
            f"{config.sie_id} has no profile {profile!r}; profiles: " + ", ".join(config.profiles)
        )
    model_id = config.sie_id if profile == DEFAULT_PROFILE else f"{config.sie_id}:{profile}"
    return ServedModel(model_id, config, config.profiles[profile])
