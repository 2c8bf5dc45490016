"""Read-time rules: what a config must satisfy beyond its schema, checked whenever a config
is read (files at start, Config API writes, ``sie-worker validate``). Problems point at what
the file wrote.

The document: at least one task that is not null; a weight source as SIE requires
(``hf_id`` or ``weights_path``, unless ``package_backed`` or ``remote_backed``, which forbid
them); one spelling per setting (:mod:`sie_worker.config.files.normalize`); ``pool`` is not
``_default``; ``routing`` fields fit its policy; ``grammar_profile`` names a non-default
profile that declares none itself and does not enable speculation; ``prewarm_grammars``
values fit their kind.

Every profile: ``tensor_parallel_size`` and ``pipeline_parallel_size`` are integers 1..8;
``extra_launch_args`` and ``extra_env``, at profile level or under loadtime, pass
:mod:`sie_worker.config.flags.launch_rules`;
``lora_paths`` and ``max_loras_per_batch`` pass :mod:`sie_worker.config.lora`;
the runtime options the worker applies are valid (:mod:`sie_worker.config.runtime`);
``extends`` names an existing profile without cycles; ``adapter_path`` is an adapter SIE
defines or this image runs (remote adapters for ``remote_backed``); a profile-level
``grammar_profile`` names a non-default sibling; ``chat_template_kwargs``,
``max_output_tokens`` and ``grammar_profile`` only on a model that generates. Load-time
rules live in :mod:`sie_worker.config.load.loadtime`.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from sie_worker.config.adapters import adapter_problem, canonical_path
from sie_worker.config.files.jsonpath import json_path
from sie_worker.config.files.normalize import alias_problems, lookup
from sie_worker.config.flags.launch_rules import (
    MAX_ARG_BYTES,
    VISIBILITY_VARIABLES,
    args_problems,
    env_problems,
    profile_engine,
)
from sie_worker.config.lora import lora_problems
from sie_worker.config.model import DEFAULT_PROFILE, JsonPath
from sie_worker.config.runtime import runtime_problems
from sie_worker.config.widths import stages_problem, width_problem
from sie_worker.errors import Problem

__all__ = ["MAX_ARG_BYTES", "VISIBILITY_VARIABLES", "rule_problems"]

_REMOTE = "sie_server.adapters.remote."
_PROFILE_GENERATE_KEYS = ("chat_template_kwargs", "max_output_tokens", "grammar_profile")


def rule_problems(doc: Mapping[str, Any]) -> list[Problem]:
    problems = alias_problems(doc) + _task_problems(doc) + _source_problems(doc)
    problems += _pool_problems(doc)
    profiles = doc.get("profiles")
    if not isinstance(profiles, dict):
        return problems
    names = [n for n in profiles if isinstance(profiles[n], dict)]
    generates = isinstance(lookup(doc, ("tasks", "generate")), dict)
    for name in names:
        problems += _profile_problems(doc, name, profiles[name], names, generates)
    problems += _cycle_problems({n: profiles[n] for n in names})
    problems += _grammar_problems(doc, {n: profiles[n] for n in names})
    problems += _routing_problems(doc, {n: profiles[n] for n in names})
    return problems


def _task_problems(doc: Mapping[str, Any]) -> list[Problem]:
    tasks = doc.get("tasks")
    if not isinstance(tasks, dict):
        return []
    problems: list[Problem] = []
    if not any(v is not None for v in tasks.values()):
        message = "declares no task; add generate, encode or score (a task that is not null)"
        problems.append(Problem("$.tasks", message))
    grammars = lookup(tasks, ("generate", "prewarm_grammars"))
    for index, grammar in enumerate(grammars if isinstance(grammars, list) else []):
        if not isinstance(grammar, dict):
            continue
        kind, value = grammar.get("kind"), grammar.get("value")
        want = dict if kind == "json_schema" else str
        if kind in ("json_schema", "regex", "ebnf") and not isinstance(value, want):
            what = "a mapping (the JSON schema)" if want is dict else "a string (the expression)"
            path = json_path(["tasks", "generate", "prewarm_grammars", index, "value"])
            problems.append(Problem(path, f"must be {what} for kind {kind}"))
    return problems


def _source_problems(doc: Mapping[str, Any]) -> list[Problem]:
    """SIE's weight-source rule: a repository and/or a folder, or a package, or a remote."""
    has = {key: doc.get(key) not in (None, False) for key in _SOURCE_KEYS}
    local = has["weights_path"] or has["model_path"]
    for flag in ("remote_backed", "package_backed"):
        if not has[flag]:
            continue
        forbidden = [k for k in _SOURCE_KEYS if has[k] and k != flag]
        if flag == "package_backed":
            forbidden = [k for k in forbidden if k != "remote_backed"]
        return [
            Problem(
                json_path([key]),
                f"cannot be set with {flag}: true (the weights come from "
                f"{'an upstream' if flag == 'remote_backed' else 'an installed package'}); "
                "remove one of the two",
            )
            for key in forbidden
        ]
    if has["hf_id"] or local:
        return []
    return [
        Problem(
            "$.hf_id",
            "is required; add hf_id: the Hugging Face repository of the weights, e.g. "
            "my-org/my-model (or weights_path for a local folder)",
        )
    ]


_SOURCE_KEYS = (
    "hf_id",
    "weights_path",
    "model_path",
    "hf_revision",
    "revision",
    "package_backed",
    "remote_backed",
)


def _pool_problems(doc: Mapping[str, Any]) -> list[Problem]:
    pool = doc.get("pool")
    if isinstance(pool, str) and pool.strip().lower() == "_default":
        return [Problem("$.pool", "'_default' is reserved; name the pool, or leave pool unset")]
    return []


def _profile_problems(
    doc: Mapping[str, Any],
    name: str,
    profile: Mapping[str, Any],
    names: list[str],
    generates: bool,
) -> list[Problem]:
    problems: list[Problem] = []
    base: JsonPath = ("profiles", name)
    engine = profile_engine(doc, name)
    options = profile.get("adapter_options")
    loadtime = options.get("loadtime") if isinstance(options, dict) else None
    runtime = options.get("runtime") if isinstance(options, dict) else None
    if isinstance(loadtime, dict):
        for key, rule in (
            ("tensor_parallel_size", width_problem),
            ("pipeline_parallel_size", stages_problem),
        ):
            message = rule(loadtime[key]) if key in loadtime else None
            if message is not None:
                path = [*base, "adapter_options", "loadtime", key]
                problems.append(Problem(json_path(path), message))
        lt = (*base, "adapter_options", "loadtime")
        for sub, message in lora_problems(loadtime, tuple(names)):
            problems.append(Problem(json_path([*lt, *sub]), message))
        lt_args = loadtime.get("extra_launch_args")
        problems += args_problems(lt_args, (*lt, "extra_launch_args"), engine)
        problems += env_problems(loadtime.get("extra_env"), (*lt, "extra_env"))
    if isinstance(runtime, dict):
        problems += runtime_problems(runtime, (*base, "adapter_options", "runtime"))
    args = profile.get("extra_launch_args")
    problems += args_problems(args, (*base, "extra_launch_args"), engine)
    problems += env_problems(profile.get("extra_env"), (*base, "extra_env"))
    extends = profile.get("extends")
    if isinstance(extends, str) and extends not in names:
        problems.append(Problem(json_path([*base, "extends"]), _no_profile(extends, names)))
    adapter = profile.get("adapter_path")
    if isinstance(adapter, str):
        message = adapter_problem(adapter)
        remote = canonical_path(adapter).startswith(_REMOTE)
        if message is None and doc.get("remote_backed") is True and not remote:
            message = (
                f"must be a remote adapter ({_REMOTE}...) on a remote_backed model, got {adapter!r}"
            )
        if message is not None:
            problems.append(Problem(json_path([*base, "adapter_path"]), message))
    if not generates:
        for key in _PROFILE_GENERATE_KEYS:
            if profile.get(key) is not None:
                message = "applies only to a model that generates (tasks.generate); remove it"
                problems.append(Problem(json_path([*base, key]), message))
    grammar = profile.get("grammar_profile")
    if isinstance(grammar, str) and generates:
        where = json_path([*base, "grammar_profile"])
        if name == DEFAULT_PROFILE:
            message = "is not allowed on default: set tasks.generate.grammar_profile instead"
            problems.append(Problem(where, message))
        elif grammar in (DEFAULT_PROFILE, name):
            message = f"must name a sibling profile other than default and {name}, got {grammar!r}"
            problems.append(Problem(where, message))
        elif grammar not in names:
            problems.append(Problem(where, _no_profile(grammar, names)))
    return problems


def _grammar_problems(
    doc: Mapping[str, Any], profiles: Mapping[str, Mapping[str, Any]]
) -> list[Problem]:
    """The model-level grammar_profile (either spelling), and every grammar target."""
    problems: list[Problem] = []
    for spelling in (("tasks", "generate", "grammar_profile"), ("grammar_profile",)):
        target = lookup(doc, spelling)
        if not isinstance(target, str):
            continue
        path = json_path(spelling)
        if target == DEFAULT_PROFILE:
            message = "must name a non-default profile (grammar requests are routed to it)"
            problems.append(Problem(path, message + "; add one and name it here"))
        elif target not in profiles:
            problems.append(Problem(path, _no_profile(target, list(profiles))))
        else:
            problems += _target_problems(path, target, profiles)
    for name, profile in profiles.items():
        target = profile.get("grammar_profile")
        if isinstance(target, str) and target in profiles and target not in (name, DEFAULT_PROFILE):
            problems += _target_problems(
                json_path(["profiles", name, "grammar_profile"]), target, profiles
            )
    return problems


def _target_problems(
    path: str, target: str, profiles: Mapping[str, Mapping[str, Any]]
) -> list[Problem]:
    problems: list[Problem] = []
    if profiles[target].get("grammar_profile") is not None:
        message = (
            f"names {target}, which declares a grammar_profile itself; name a profile that does not"
        )
        problems.append(Problem(path, message))
    speculative = _resolved_loadtime(target, profiles).get("speculative")
    if isinstance(speculative, dict) and speculative.get("enabled") is True:
        message = (
            f"names {target}, which enables speculative decoding (it bypasses the grammar "
            "backend); name a profile with speculative.enabled: false"
        )
        problems.append(Problem(path, message))
    return problems


def _resolved_loadtime(name: str, profiles: Mapping[str, Mapping[str, Any]]) -> Mapping[str, Any]:
    """The loadtime block a profile ends up with (the nearest nonempty one up its chain)."""
    seen: set[str] = set()
    current: str | None = name
    while isinstance(current, str) and current in profiles and current not in seen:
        seen.add(current)
        loadtime = lookup(profiles[current], ("adapter_options", "loadtime"))
        if isinstance(loadtime, dict) and loadtime:
            return loadtime
        current = profiles[current].get("extends")
    return {}


def _routing_problems(
    doc: Mapping[str, Any], profiles: Mapping[str, Mapping[str, Any]]
) -> list[Problem]:
    routing = doc.get("routing")
    if not isinstance(routing, dict) or not isinstance(routing.get("policy"), str):
        return []
    policy = routing["policy"]
    problems: list[Problem] = []
    thresholds = ("wake_above", "sleep_below", "window_s", "cooldown_s")
    allowed = {
        "remote_only": set(),
        "fallback": {"fallback_profile", "triggers"},
        "threshold": {"fallback_profile", *thresholds},
    }.get(policy)
    if allowed is None:
        return []  # the schema names the policies
    for key, value in routing.items():
        if key != "policy" and value is not None and key not in allowed:
            message = f"does not apply to routing policy {policy}; remove it"
            problems.append(Problem(json_path(["routing", key]), message))
    if policy == "remote_only" and doc.get("remote_backed") is not True:
        message = "remote_only needs remote_backed: true; use fallback or threshold"
        problems.append(Problem("$.routing.policy", message))
    if policy in ("fallback", "threshold"):
        fallback = routing.get("fallback_profile")
        if not isinstance(fallback, str):
            problems.append(Problem("$.routing.fallback_profile", f"is required by {policy}"))
        elif fallback == DEFAULT_PROFILE or fallback not in profiles:
            others = [n for n in profiles if n != DEFAULT_PROFILE]
            message = f"must name a non-default profile, got {fallback!r}; profiles: " + (
                ", ".join(others) or "none"
            )
            problems.append(Problem("$.routing.fallback_profile", message))
        if DEFAULT_PROFILE not in profiles:
            problems.append(Problem("$.routing", f"{policy} needs a default profile"))
    if policy == "threshold":
        for key in thresholds:
            if routing.get(key) is None:
                problems.append(Problem(json_path(["routing", key]), "is required by threshold"))
        wake, sleep = routing.get("wake_above"), routing.get("sleep_below")
        if isinstance(wake, int | float) and isinstance(sleep, int | float) and sleep >= wake:
            message = f"must be below wake_above ({wake}), got {sleep}"
            problems.append(Problem("$.routing.sleep_below", message))
    return problems


def _cycle_problems(profiles: Mapping[str, Mapping[str, Any]]) -> list[Problem]:
    problems: list[Problem] = []
    reported: set[str] = set()
    for start in profiles:
        chain = [start]
        current = profiles[start].get("extends")
        while isinstance(current, str) and current in profiles:
            if current in chain:
                cycle = [*chain[chain.index(current) :], current]
                if not reported.intersection(cycle):
                    reported.update(cycle)
                    message = (
                        f"profiles extend each other in a cycle ({' -> '.join(cycle)}); "
                        "remove one of these extends"
                    )
                    problems.append(Problem(json_path(["profiles", current, "extends"]), message))
                break
            chain.append(current)
            current = profiles[current].get("extends")
    return problems


def _no_profile(name: str, names: list[str]) -> str:
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]}?" if close else "profiles: " + ", ".join(names)
    return f"names no profile of this config ({name!r}); {hint}"
