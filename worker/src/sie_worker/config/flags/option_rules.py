"""The value rules of the engines' load-time options, the release they are checked against,
and the row of an engine's option table (:class:`EngineOption`).

A :class:`Rule` says what it accepts (for people: the README's table) and checks a value,
returning why it is refused or None. Rules that depend on the release read its option table
(:mod:`sie_worker.config.flags.option_tables`): a choice-valued flag's ``choices``, with the
release that has a value another lacks. Pure.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from sie_worker.config.files.values import described, shown
from sie_worker.config.flags.option_tables import OptionTable, option_tables
from sie_worker.config.lora import lora_problems
from sie_worker.config.runtime import sampling_problem, stops_problem
from sie_worker.config.widths import stages_problem, width_problem

__all__ = [
    "SPECULATIVE_KEYS",
    "Applied",
    "EngineOption",
    "Release",
    "Rule",
    "boolean",
    "choice_of",
    "choice_problem",
    "engine_option_problem",
    "fraction",
    "guard",
    "integer",
    "later",
    "lora_paths",
    "mapping",
    "precision",
    "revision",
    "rule_of",
    "sampling",
    "seconds",
    "speculative",
    "stages",
    "stops",
    "template",
    "text",
    "width",
]

_COMMIT = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class Release:
    """The engine release a load runs: its version, the bundle it comes from, and its
    option table (None when no table ships for it: release checks are then skipped)."""

    version: str
    bundle: str
    table: OptionTable | None
    label: str = "SGLang"

    @property
    def name(self) -> str:
        return f"{self.label} {self.version} (bundle {self.bundle})"


@dataclass(frozen=True)
class Rule:
    """A value rule: what it accepts (for people) and the check (None: the value passes)."""

    accepts: str
    check: Callable[[Any, Release], str | None]

    def __call__(self, value: Any, release: Release) -> str | None:
        return self.check(value, release)


def rule_of(accepts: str) -> Callable[[Callable[[Any, Release], str | None]], Rule]:
    def wrap(check: Callable[[Any, Release], str | None]) -> Rule:
        return Rule(accepts, check)

    return wrap


Applied = Literal["flag", "worker", "inert", "hook", "later"]


@dataclass(frozen=True)
class EngineOption:
    """One load-time option of an engine's adapters: the adapter families that accept it,
    how it is applied (``flag``: the engine flag ``flag``; ``worker``: the worker applies it;
    ``inert``: accepted, no effect; ``hook``: SIE's own engine code, accepted and not applied;
    ``later``: refused), the value rule, the default and what it does (for the README)."""

    name: str
    families: frozenset[str]
    applied: Applied
    flag: str | None
    rule: Rule
    default: str
    meaning: str


def engine_option_problem(option: EngineOption, value: Any, release: Release) -> str | None:
    """Why this option's value breaks its rule (or needs a flag the release lacks), or None."""
    message = option.rule(value, release)
    if message is not None:
        return message
    table = release.table
    if (
        option.applied == "flag"
        and option.flag is not None
        and table is not None
        and not table.has(option.flag)
    ):
        return (
            f"needs {option.flag}, which {release.name} lacks: remove it, or serve the model "
            f"from a bundle whose {release.label} has it"
        )
    return None


@rule_of("true or false")
def boolean(value: Any, release: Release) -> str | None:
    return None if isinstance(value, bool) else f"must be true or false, got {described(value)}"


@rule_of("a finite number of seconds > 0")
def seconds(value: Any, release: Release) -> str | None:
    expected = "must be a finite number of seconds above zero"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{expected}, got {described(value)}"
    try:
        seconds = float(value)
    except OverflowError:
        return f"{expected}, got a number too large to be a duration"
    if not math.isfinite(seconds) or seconds <= 0:
        return f"{expected}, got {shown(value)}"
    return None


def integer(low: int, high: int | None = None, what: str = "an integer") -> Rule:
    accepts = f"{what} {low}..{high}" if high is not None else f"{what} >= {low}"

    @rule_of(accepts)
    def check(value: Any, release: Release) -> str | None:
        limit = f"from {low} to {high}" if high is not None else f"of at least {low}"
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or value < low
            or (high is not None and value > high)
        ):
            return f"must be {what} {limit}, got {described(value)}"
        return None

    return check


@rule_of("a number > 0 and < 1")
def fraction(value: Any, release: Release) -> str | None:
    expected = "must be a number above 0 and below 1 (the share of GPU memory, e.g. 0.85)"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{expected}, got {described(value)}"
    if not (math.isfinite(float(value)) and 0 < value < 1):
        return f"{expected}, got {shown(value)}"
    return None


@rule_of("a nonempty string")
def text(value: Any, release: Release) -> str | None:
    if isinstance(value, str) and value.strip():
        return None
    return f"must be a nonempty string, got {described(value)}"


@rule_of("a built-in template name or a file path")
def template(value: Any, release: Release) -> str | None:
    if isinstance(value, str) and value.strip():
        return None
    return (
        "must be an SGLang built-in template name (e.g. chatml) or a template file path, "
        f"got {described(value)}"
    )


@rule_of("a branch, tag or commit")
def revision(value: Any, release: Release) -> str | None:
    if isinstance(value, str) and value and not any(c.isspace() for c in value):
        return None
    return f"must be a branch, tag or commit hash without whitespace, got {described(value)}"


@rule_of("auto, float32, float16 or bfloat16")
def precision(value: Any, release: Release) -> str | None:
    allowed = ("auto", "float32", "float16", "bfloat16")
    if value in allowed:
        return None
    return f"must be one of {', '.join(allowed)}, got {described(value)}"


@rule_of("a mapping")
def mapping(value: Any, release: Release) -> str | None:
    return None if isinstance(value, dict) else f"must be a mapping, got {described(value)}"


def choice_of(flag: str, *, nullable: bool = False) -> Rule:
    accepts = f"one of the release's {flag} choices" + (" or null" if nullable else "")

    @rule_of(accepts)
    def check(value: Any, release: Release) -> str | None:
        if value is None and nullable:
            return None
        if not isinstance(value, str) or not value.strip():
            none = " (or null for SGLang's default)" if nullable else ""
            return f"must be a nonempty string{none}, got {described(value)}"
        return choice_problem(flag, value, release)

    return check


def choice_problem(flag: str, value: str, release: Release) -> str | None:
    """Why ``value`` is not one of ``flag``'s choices in this release (with the release that
    has it, when another shipped one does), or None. No table or no choices: None."""
    action = release.table.action_of(flag) if release.table is not None else None
    if action is None or action.choices is None or value in action.choices:
        return None
    close = difflib.get_close_matches(value, action.choices, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else ""
    elsewhere = [
        t.version
        for t in option_tables()
        if t.version != release.version
        and (other := t.action_of(flag)) is not None
        and other.choices is not None
        and value in other.choices
    ]
    where = (
        f" ({value!r} is a choice in SGLang {', '.join(elsewhere)}: serve the model from the "
        "bundle that runs it)"
        if elsewhere
        else ""
    )
    choices = ", ".join(action.choices)
    return f"{value!r} is not a {flag} choice of {release.name}: {choices}{hint}{where}"


SPECULATIVE_KEYS: Mapping[str, str] = {
    "enabled": "turn speculative decoding on (default false: no speculative flags)",
    "algorithm": "--speculative-algorithm",
    "num_steps": "--speculative-num-steps",
    "eagle_topk": "--speculative-eagle-topk",
    "num_draft_tokens": "--speculative-num-draft-tokens",
    "draft_model": "--speculative-draft-model-path",
    "draft_model_revision": "--speculative-draft-model-revision",
}


@rule_of("a mapping of the keys below; algorithm one of the release's choices")
def speculative(value: Any, release: Release) -> str | None:
    if not isinstance(value, dict):
        return f"must be a mapping with enabled, algorithm, ..., got {described(value)}"
    problems: list[str] = []
    for key in value:
        if key not in SPECULATIVE_KEYS:
            close = difflib.get_close_matches(str(key), list(SPECULATIVE_KEYS), n=1, cutoff=0.6)
            hint = f"did you mean {close[0]}?" if close else "keys: " + ", ".join(SPECULATIVE_KEYS)
            problems.append(f"{key!r} is not a speculative key; {hint}")
    if "enabled" in value and not isinstance(value["enabled"], bool):
        problems.append(f"enabled must be true or false, got {described(value['enabled'])}")
    revision = value.get("draft_model_revision")
    if revision is not None:
        if not (isinstance(revision, str) and _COMMIT.match(revision)):
            got = described(revision)
            problems.append(f"draft_model_revision must be a 40-character commit hash, got {got}")
        if not (isinstance(value.get("draft_model"), str) and value["draft_model"].strip()):
            problems.append("draft_model_revision needs draft_model (the draft's repository)")
    if value.get("enabled") is True:
        algorithm = value.get("algorithm")
        if not isinstance(algorithm, str) or not algorithm.strip():
            problems.append(
                "algorithm is required when enabled (e.g. nextn or eagle); "
                f"got {described(algorithm)}"
            )
        else:
            choice = choice_problem("--speculative-algorithm", algorithm.strip().upper(), release)
            if choice is not None:
                problems.append(f"algorithm: {choice}")
        for key in ("num_steps", "eagle_topk", "num_draft_tokens"):
            if key in value:
                number = value[key]
                if isinstance(number, bool) or not isinstance(number, int) or number < 1:
                    got = described(number)
                    problems.append(f"{key} must be an integer of at least 1, got {got}")
        draft = value.get("draft_model")
        if draft is not None and not (isinstance(draft, str) and draft.strip()):
            problems.append(f"draft_model must be a nonempty string, got {described(draft)}")
    return "; ".join(problems) or None


@rule_of("{threshold: 0..1, positive, negative}")
def guard(value: Any, release: Release) -> str | None:
    if not isinstance(value, dict):
        return f"must be a mapping with threshold (0..1), got {described(value)}"
    threshold = value.get("threshold")
    if threshold is not None and (
        isinstance(threshold, bool)
        or not isinstance(threshold, int | float)
        or not (math.isfinite(float(threshold)) and 0 <= threshold <= 1)
    ):
        return f"threshold must be a number from 0 to 1, got {described(threshold)}"
    for key in ("positive", "negative"):
        if key in value and not (isinstance(value[key], str) and value[key]):
            return f"{key} must be a nonempty string, got {described(value[key])}"
    return None


@rule_of("an integer 1..8, at most the worker's devices")
def width(value: Any, release: Release) -> str | None:
    return width_problem(value)


@rule_of("an integer 1..8; the model's width is tensor_parallel_size x this")
def stages(value: Any, release: Release) -> str | None:
    return stages_problem(value)


def later(issue: str) -> Rule:
    @rule_of(f"not served yet ({issue})")
    def check(value: Any, release: Release) -> str | None:
        return (
            f"is not served by this worker yet ({issue}); remove it, or serve the model "
            "with SIE's own server"
        )

    return check


@rule_of("as runtime.default_sampling")
def sampling(value: Any, release: Release) -> str | None:
    return sampling_problem(value)


@rule_of("a list of nonempty strings")
def stops(value: Any, release: Release) -> str | None:
    return stops_problem(value)


@rule_of("name -> repo id or folder, or a list of 'name=path' (see Multi-LoRA)")
def lora_paths(value: Any, release: Release) -> str | None:
    problems = lora_problems({"lora_paths": value})
    return "; ".join(message for _, message in problems) or None
