"""One spelling per setting: SIE's keys and this project's earlier ones, read once.

SIE 0.10.1 and this project named some settings differently; both spellings are accepted and
mean the same thing (:data:`TOP_LEVEL_ALIASES`, :data:`PROFILE_ALIASES`). A config that sets
both spellings of one setting is refused when it is read (:func:`alias_problems`), naming both
paths; otherwise :func:`build_config` turns the checked document into one
:class:`~sie_worker.config.model.ModelConfig` whose fields hold the value, wherever it was
written, and remember where (for problems found later).

Profile inheritance (``extends``), as in SIE with chains allowed: a field the profile sets
to a value replaces the parent's, and ``null`` inherits; ``adapter_options.loadtime`` and
``.runtime`` are inherited when absent or empty and replaced whole when nonempty;
``adaptive_batching`` merges field by field; ``grammar_profile`` is never inherited.
``extra_launch_args`` (replaced whenever the profile sets it) and ``extra_env`` (replaced when
nonempty) can come from the profile level or from its loadtime block; the one written nearer
the profile wins, so a nonempty loadtime block that lacks them drops a parent's loadtime
arguments but keeps its profile-level ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from sie_worker.config.files.jsonpath import json_path
from sie_worker.config.model import DEFAULT_PROFILE, JsonPath, ModelConfig, Profile
from sie_worker.errors import Problem

__all__ = [
    "PROFILE_ALIASES",
    "TOP_LEVEL_ALIASES",
    "Alias",
    "alias_problems",
    "build_config",
    "lookup",
]

_MISSING = object()


@dataclass(frozen=True)
class Alias:
    """One setting, spelled ``sie`` (SIE 0.10.1's path) or ``ours`` (this project's)."""

    setting: str
    sie: JsonPath
    ours: JsonPath
    means: str  # what the setting is, for the refusal message


TOP_LEVEL_ALIASES: tuple[Alias, ...] = (
    Alias("revision", ("hf_revision",), ("revision",), "the revision of hf_id"),
    Alias("model_path", ("weights_path",), ("model_path",), "the local weights folder"),
    Alias(
        "grammar_profile",
        ("tasks", "generate", "grammar_profile"),
        ("grammar_profile",),
        "the profile grammar-constrained requests go to",
    ),
    Alias(
        "max_sequence_length",
        ("max_sequence_length",),
        ("tasks", "encode", "max_sequence_length"),
        "the longest input in tokens",
    ),
    Alias(
        "dense_dim",
        ("tasks", "encode", "dense", "dim"),
        ("tasks", "encode", "dimensions"),
        "the width of the dense vectors",
    ),
)
PROFILE_ALIASES: tuple[Alias, ...] = (
    Alias(
        "extra_launch_args",
        ("adapter_options", "loadtime", "extra_launch_args"),
        ("extra_launch_args",),
        "the arguments appended to the engine's command line",
    ),
    Alias(
        "extra_env",
        ("adapter_options", "loadtime", "extra_env"),
        ("extra_env",),
        "the variables added to the engine's environment",
    ),
)


def lookup(doc: object, path: JsonPath) -> Any:
    """The value at ``path`` in ``doc``, or None when any step is missing (or null)."""
    node: Any = doc
    for part in path:
        if isinstance(part, str) and isinstance(node, Mapping):
            node = node.get(part)
        elif isinstance(part, int) and isinstance(node, list) and -len(node) <= part < len(node):
            node = node[part]
        else:
            return None
        if node is None:
            return None
    return node


def alias_problems(doc: Mapping[str, Any]) -> list[Problem]:
    """A problem for every setting the document spells both ways (values are irrelevant)."""
    problems: list[Problem] = []
    for alias in TOP_LEVEL_ALIASES:
        problems += _both(doc, alias, ())
    profiles = doc.get("profiles")
    if isinstance(profiles, Mapping):
        for name, profile in profiles.items():
            if isinstance(profile, Mapping):
                for alias in PROFILE_ALIASES:
                    problems += _both(profile, alias, ("profiles", name))
    return problems


def _both(doc: Mapping[str, Any], alias: Alias, base: JsonPath) -> list[Problem]:
    if lookup(doc, alias.sie) is None or lookup(doc, alias.ours) is None:
        return []
    ours, sie = json_path([*base, *alias.ours]), json_path([*base, *alias.sie])
    message = (
        f"is also set at {sie}, SIE's spelling of the same setting ({alias.means}); keep one "
        "of the two"
    )
    return [Problem(ours, message)]


# --- building the resolved config ----------------------------------------------------------


def build_config(
    doc: Mapping[str, Any], *, source: str | None, base_dir: Path | None
) -> ModelConfig:
    """The normalised config of a document that passed the schema and the read-time rules."""
    values: dict[str, Any] = {}
    paths: dict[str, JsonPath] = {}
    for alias in TOP_LEVEL_ALIASES:
        for spelling in (alias.sie, alias.ours):
            value = lookup(doc, spelling)
            if value is not None:
                values[alias.setting], paths[alias.setting] = value, spelling
    raw_profiles: Mapping[str, Mapping[str, Any]] = doc["profiles"]
    resolved: dict[str, Profile] = {}

    def build(name: str) -> Profile:
        if name not in resolved:
            raw = raw_profiles[name]
            extends = raw.get("extends")
            parent = build(extends) if isinstance(extends, str) else None
            resolved[name] = _resolve_profile(name, raw, parent)
        return resolved[name]

    # Default first, then the others in the order written.
    order = sorted(raw_profiles, key=lambda n: n != DEFAULT_PROFILE)
    for name in order:
        build(name)
    tasks = {
        k: MappingProxyType(dict(v)) for k, v in (doc.get("tasks") or {}).items() if v is not None
    }
    inputs = doc.get("inputs") or {}
    pool = doc.get("pool")
    pool = pool.strip().lower() or None if isinstance(pool, str) else None
    return ModelConfig(
        sie_id=doc["sie_id"],
        hf_id=doc.get("hf_id") or "",
        revision=values.get("revision"),
        model_path=values.get("model_path"),
        tasks=MappingProxyType(tasks),
        profiles=MappingProxyType({n: resolved[n] for n in order}),
        grammar_profile=values.get("grammar_profile"),
        source=source,
        raw=MappingProxyType(dict(doc)),
        base_dir=base_dir,
        max_sequence_length=values.get("max_sequence_length"),
        dense_dim=values.get("dense_dim"),
        package_backed=doc.get("package_backed") is True,
        remote_backed=doc.get("remote_backed") is True,
        pool=pool,
        inputs=tuple(
            k
            for k in ("text", "image", "audio", "video", "document")
            if inputs.get(k, k == "text") is True
        ),
        paths=MappingProxyType(paths),
    )


def _resolve_profile(name: str, raw: Mapping[str, Any], parent: Profile | None) -> Profile:
    options = raw.get("adapter_options") or {}
    own_loadtime = dict(options.get("loadtime") or {})
    loadtime_args = own_loadtime.pop("extra_launch_args", _MISSING)
    loadtime_env = own_loadtime.pop("extra_env", _MISSING)
    own_runtime = options.get("runtime") or {}
    # The loadtime block counts as set when it is nonempty as written (args/env included).
    sets_loadtime = bool(options.get("loadtime"))

    def scalar(key: str) -> Any:
        if raw.get(key) is not None:
            return raw[key]
        return getattr(parent, key) if parent is not None else None

    base: JsonPath = ("profiles", name)
    loadtime_path = (*base, "adapter_options", "loadtime")
    args, args_path = _channel(
        own=raw.get("extra_launch_args", _MISSING),
        own_set=raw.get("extra_launch_args") is not None,  # [] clears inherited arguments
        own_path=(*base, "extra_launch_args"),
        loadtime=loadtime_args,
        loadtime_path=(*loadtime_path, "extra_launch_args"),
        sets_loadtime=sets_loadtime,
        parent=(parent.extra_launch_args, parent.launch_args_path) if parent else None,
        empty=(),
    )
    env, env_path = _channel(
        own=raw.get("extra_env", _MISSING),
        own_set=bool(raw.get("extra_env")),
        own_path=(*base, "extra_env"),
        loadtime=loadtime_env,
        loadtime_path=(*loadtime_path, "extra_env"),
        sets_loadtime=sets_loadtime,
        parent=(parent.extra_env, parent.env_path) if parent else None,
        empty={},
    )
    inherit_loadtime = not sets_loadtime and parent is not None
    inherit_runtime = not own_runtime and parent is not None
    batching = dict(parent.adaptive_batching) if parent else {}
    own_batching = raw.get("adaptive_batching") or {}
    batching.update({k: v for k, v in own_batching.items() if v is not None})
    return Profile(
        name=name,
        extends=raw.get("extends"),
        max_batch_tokens=scalar("max_batch_tokens"),
        compute_precision=scalar("compute_precision"),
        kv_budget_tokens=scalar("kv_budget_tokens"),
        adapter_path=scalar("adapter_path"),
        loadtime=parent.loadtime if inherit_loadtime and parent else MappingProxyType(own_loadtime),
        runtime=parent.runtime if inherit_runtime and parent else _frozen_or_empty(own_runtime),
        extra_launch_args=tuple(args),
        extra_env=MappingProxyType(dict(env)),
        loadtime_from=parent.loadtime_from if inherit_loadtime and parent else name,
        runtime_from=parent.runtime_from if inherit_runtime and parent else name,
        launch_args_path=args_path,
        env_path=env_path,
        max_output_tokens=scalar("max_output_tokens"),
        chat_template_kwargs=_frozen(scalar("chat_template_kwargs")),
        grammar_profile=raw.get("grammar_profile"),
        admission_enabled=scalar("admission_enabled"),
        adaptive_batching=MappingProxyType(batching),
    )


def _channel(
    *,
    own: Any,
    own_set: bool,
    own_path: JsonPath,
    loadtime: Any,
    loadtime_path: JsonPath,
    sets_loadtime: bool,
    parent: tuple[Any, JsonPath] | None,
    empty: Any,
) -> tuple[Any, JsonPath]:
    """One of extra_launch_args / extra_env and where it was written: the profile's own
    profile-level value, else its own loadtime one, else the parent's (unless the profile's
    nonempty loadtime block replaced the parent's loadtime, where the parent's came from)."""
    if own_set:
        return own, own_path
    if loadtime is not _MISSING and loadtime is not None:
        return loadtime, loadtime_path
    if parent is None:
        return empty, own_path
    value, path = parent
    if sets_loadtime and path[-3:-1] == ("adapter_options", "loadtime"):
        return empty, own_path  # a nonempty loadtime block replaces the parent's whole
    return value, path


def _frozen_or_empty(value: Any) -> Mapping[str, Any]:
    return MappingProxyType(dict(value))


def _frozen(value: Any) -> Mapping[str, Any] | None:
    return MappingProxyType(dict(value)) if isinstance(value, Mapping) else None
