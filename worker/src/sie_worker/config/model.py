"""A model config as the worker holds it once read: the config, its resolved profiles, and
the served models it names (``<sie_id>`` for the default profile, ``<sie_id>:<profile>``
for each other one; a config without a default profile serves only the latter).

Everything here is normalised: where SIE and this project spell one setting two ways
(``hf_revision``/``revision``, ``weights_path``/``model_path``, ...) the fields hold the one
value, and ``*_path`` fields say where in the file it was written, for problems.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

__all__ = [
    "DEFAULT_PROFILE",
    "JsonPath",
    "ModelConfig",
    "Profile",
    "ServedModel",
    "served_model",
    "served_models",
]

DEFAULT_PROFILE = "default"
JsonPath = tuple[str | int, ...]
_EMPTY: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True)
class Profile:
    name: str
    extends: str | None
    max_batch_tokens: int | None
    compute_precision: str | None  # None: the engine's default
    kv_budget_tokens: int | None
    adapter_path: str | None  # None -> bundle default (see adapters.py)
    # After extends resolution; extra_launch_args/extra_env are not in it (fields below).
    loadtime: Mapping[str, Any]
    runtime: Mapping[str, Any]
    extra_launch_args: tuple[str, ...]
    extra_env: Mapping[str, str]
    loadtime_from: str = DEFAULT_PROFILE  # the profile whose loadtime block this is (paths)
    runtime_from: str = DEFAULT_PROFILE  # the profile whose runtime block this is (paths)
    # Where extra_launch_args / extra_env were written (profile level or under loadtime).
    launch_args_path: JsonPath = ()
    env_path: JsonPath = ()
    max_output_tokens: int | None = None  # the profile's own cap (inherited), else None
    chat_template_kwargs: Mapping[str, Any] | None = None  # the profile's (inherited)
    grammar_profile: str | None = None  # profile-scoped, never inherited
    admission_enabled: bool | None = None
    adaptive_batching: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelConfig:
    sie_id: str
    hf_id: str  # "" when the config names no repository (weights_path, package/remote)
    revision: str | None  # hf_revision or revision
    model_path: str | None  # weights_path or model_path, as written (see model_shape)
    tasks: Mapping[str, Mapping[str, Any]]  # the tasks that are not null, as written
    profiles: Mapping[str, Profile]  # resolved (extends applied), default first when present
    grammar_profile: str | None  # tasks.generate.grammar_profile or top-level grammar_profile
    source: str | None  # file path or "<request>"
    raw: Mapping[str, Any]  # the document as read
    base_dir: Path | None = None  # where a relative model_path starts (the file's folder)
    max_sequence_length: int | None = None  # top level, or tasks.encode.max_sequence_length
    dense_dim: int | None = None  # tasks.encode.dense.dim or tasks.encode.dimensions
    package_backed: bool = False
    remote_backed: bool = False
    pool: str | None = None  # stripped, lower case; None when unset or empty
    inputs: tuple[str, ...] = ("text",)
    # Paths of normalised values, where the file wrote them.
    paths: Mapping[str, JsonPath] = field(default_factory=dict)

    @property
    def generate(self) -> Mapping[str, Any]:
        """``tasks.generate`` (empty when the model does not generate)."""
        return self.tasks.get("generate", _EMPTY)

    def path_of(self, name: str) -> JsonPath:
        """Where the normalised setting ``name`` was written (its SIE spelling when unset)."""
        return self.paths.get(name, (name,))


@dataclass(frozen=True)
class ServedModel:
    """One served model id: ``sie_id`` for the default profile, else ``<sie_id>:<profile>``."""

    id: str
    config: ModelConfig
    profile: Profile

    @property
    def chat_template_kwargs(self) -> Mapping[str, Any]:
        """Task-level chat-template arguments with the profile's merged over them (SIE)."""
        task = self.config.generate.get("chat_template_kwargs") or {}
        return MappingProxyType({**task, **(self.profile.chat_template_kwargs or {})})

    @property
    def revision(self) -> str | None:
        """The revision of ``hf_id`` this served model runs: the profile's
        ``loadtime.revision`` (SIE's per-profile override), else the config's."""
        own = self.profile.loadtime.get("revision")
        return own if isinstance(own, str) and own else self.config.revision

    @property
    def max_output_tokens(self) -> int | None:
        """The profile's output cap, else the task's."""
        if self.profile.max_output_tokens is not None:
            return self.profile.max_output_tokens
        value = self.config.generate.get("max_output_tokens")
        return value if isinstance(value, int) else None


def served_models(config: ModelConfig) -> list[ServedModel]:
    """The default profile as ``sie_id`` (when there is one), then every other profile as
    ``<sie_id>:<profile>``."""
    return [served_model(config, name) for name in config.profiles]


def served_model(config: ModelConfig, profile: str) -> ServedModel:
    """The served model of one profile; KeyError names the profiles when it does not exist."""
    if profile not in config.profiles:
        raise KeyError(
            f"{config.sie_id} has no profile {profile!r}; profiles: " + ", ".join(config.profiles)
        )
    model_id = config.sie_id if profile == DEFAULT_PROFILE else f"{config.sie_id}:{profile}"
    return ServedModel(model_id, config, config.profiles[profile])
