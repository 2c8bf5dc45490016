"""The SGLang adapters' load-time options: one table, option -> SGLang flag -> rule.

Each :class:`SGLangOption` names the adapter families that accept it (SIE's generation
family: generation, Gemma, cu130, strict thinking, and this project's chat adapter; SIE's
embedding adapter), how it is applied, the SGLang flag it means (its help text is that of
SGLang's own ``--help``, 0.5.10.post1 and 0.5.23), the value rule, and the default. Rules
that depend on the release (a flag it lacks, its ``choices``) read the release's option table
(:mod:`sie_worker.config.sglang_options`). Pure; the resolver in
:mod:`sie_worker.config.loadtime` and the launcher in :mod:`sie_worker.worker.launch` read it.

How options are applied (``applied``):

- ``flag``: the worker passes the SGLang flag (``--mem-fraction-static 0.9``);
- ``worker``: the worker itself applies it (width, timeouts, ports, the engine's name);
- ``inert``: accepted and without effect, as in SIE on a CUDA worker (``mlx_repo``);
- ``hook``: SIE implements it with its own code inside or around the engine (a patch of
  XGrammar, a logit processor, a verdict rewrite); stock SGLang has no such setting, so it is
  accepted, checked, and not applied (``sie-worker plan`` warns);
- ``later``: not served yet (multi-LoRA): refused with why.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from sie_worker.config.sglang_options import OptionTable, option_tables
from sie_worker.config.values import described, shown

__all__ = [
    "FAMILIES",
    "SGLANG_OPTIONS",
    "SPECULATIVE_KEYS",
    "Applied",
    "Family",
    "Release",
    "Rule",
    "SGLangOption",
    "choice_problem",
    "option_problem",
    "options_for",
    "speculative_args",
]

Family = Literal["generation", "embedding", "chat"]
Applied = Literal["flag", "worker", "inert", "hook", "later"]
FAMILIES: tuple[Family, ...] = ("generation", "embedding", "chat")
_GEN: frozenset[Family] = frozenset({"generation", "chat"})
_ALL: frozenset[Family] = frozenset(FAMILIES)
_EMB: frozenset[Family] = frozenset({"embedding"})
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class Release:
    """The SGLang release an engine runs: its version, the bundle it comes from, and its
    option table (None when no table ships for it: release checks are then skipped)."""

    version: str
    bundle: str
    table: OptionTable | None

    @property
    def name(self) -> str:
        return f"SGLang {self.version} (bundle {self.bundle})"


@dataclass(frozen=True)
class Rule:
    """A value rule: what it accepts (for people) and the check (None: the value passes)."""

    accepts: str
    check: Callable[[Any, Release], str | None]

    def __call__(self, value: Any, release: Release) -> str | None:
        return self.check(value, release)


def _rule(accepts: str) -> Callable[[Callable[[Any, Release], str | None]], Rule]:
    def wrap(check: Callable[[Any, Release], str | None]) -> Rule:
        return Rule(accepts, check)

    return wrap


@dataclass(frozen=True)
class SGLangOption:
    name: str
    families: frozenset[Family]
    applied: Applied
    flag: str | None  # the SGLang option string it sets (None: no flag)
    rule: Rule
    default: str  # for documentation
    meaning: str  # what it does (SGLang's help for flags)


# --- value rules ---------------------------------------------------------------------------


@_rule("true or false")
def _boolean(value: Any, release: Release) -> str | None:
    return None if isinstance(value, bool) else f"must be true or false, got {described(value)}"


@_rule("a finite number of seconds > 0")
def _seconds(value: Any, release: Release) -> str | None:
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


def _integer(low: int, high: int | None = None, what: str = "an integer") -> Rule:
    accepts = f"{what} {low}..{high}" if high is not None else f"{what} >= {low}"

    @_rule(accepts)
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


@_rule("a number > 0 and < 1")
def _fraction(value: Any, release: Release) -> str | None:
    expected = "must be a number above 0 and below 1 (the share of GPU memory, e.g. 0.85)"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{expected}, got {described(value)}"
    if not (math.isfinite(float(value)) and 0 < value < 1):
        return f"{expected}, got {shown(value)}"
    return None


@_rule("a nonempty string")
def _text(value: Any, release: Release) -> str | None:
    if isinstance(value, str) and value.strip():
        return None
    return f"must be a nonempty string, got {described(value)}"


@_rule("a built-in template name or a file path")
def _template(value: Any, release: Release) -> str | None:
    if isinstance(value, str) and value.strip():
        return None
    return (
        "must be an SGLang built-in template name (e.g. chatml) or a template file path, "
        f"got {described(value)}"
    )


@_rule("a branch, tag or commit")
def _revision(value: Any, release: Release) -> str | None:
    if isinstance(value, str) and value and not any(c.isspace() for c in value):
        return None
    return f"must be a branch, tag or commit hash without whitespace, got {described(value)}"


@_rule("auto, float32, float16 or bfloat16")
def _precision(value: Any, release: Release) -> str | None:
    allowed = ("auto", "float32", "float16", "bfloat16")
    if value in allowed:
        return None
    return f"must be one of {', '.join(allowed)}, got {described(value)}"


@_rule("a mapping")
def _mapping(value: Any, release: Release) -> str | None:
    return None if isinstance(value, dict) else f"must be a mapping, got {described(value)}"


def _choice_of(flag: str, *, nullable: bool = False) -> Rule:
    accepts = f"one of the release's {flag} choices" + (" or null" if nullable else "")

    @_rule(accepts)
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


@_rule("a mapping of the keys below; algorithm one of the release's choices")
def _speculative(value: Any, release: Release) -> str | None:
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


@_rule("{threshold: 0..1, positive, negative}")
def _guard(value: Any, release: Release) -> str | None:
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


@_rule("an integer 1..8, at most the worker's devices")
def _width(value: Any, release: Release) -> str | None:
    # Imported here: rules imports the adapters, whose declarations import this table.
    from sie_worker.config.rules import width_problem

    return width_problem(value)


def _later(issue: str) -> Rule:
    @_rule(f"not served yet ({issue})")
    def check(value: Any, release: Release) -> str | None:
        return (
            f"is not served by this worker yet ({issue}); remove it, or serve the model "
            "with SIE's own server"
        )

    return check


@_rule("as runtime.default_sampling")
def _sampling(value: Any, release: Release) -> str | None:
    from sie_worker.config.runtime import sampling_problem  # runtime imports this table

    return sampling_problem(value)


@_rule("a list of nonempty strings")
def _stops(value: Any, release: Release) -> str | None:
    from sie_worker.config.runtime import stops_problem

    return stops_problem(value)


# --- the table ------------------------------------------------------------------------------


def _o(
    name: str,
    families: frozenset[Family],
    applied: Applied,
    flag: str | None,
    rule: Rule,
    default: str,
    meaning: str,
) -> SGLangOption:
    return SGLangOption(name, families, applied, flag, rule, default, meaning)


_SIE_HOOK = "SIE applies it with its own code in the engine process; stock SGLang has none"
_SIE_REQUEST = "SIE's embedding adapter applies it per request; the worker relays requests as sent"

_TABLE: tuple[SGLangOption, ...] = (
    # The seed's six, plus disable_cuda_graph.
    _o("tensor_parallel_size", _ALL, "worker", "--tp-size", _width, "1",
       "GPUs the model is split across (the worker's block and --tp-size)"),
    _o("request_read_timeout_s", _ALL, "worker", None, _seconds,
       "generation: SIE_SGLANG_GENERATE_READ_TIMEOUT_S, else none; embedding: 60",
       "seconds the worker waits for the engine's next bytes before failing the request"),
    _o("startup_timeout_s", _ALL, "worker", None, _seconds, "SIE_MODEL_READY_TIMEOUT_S, else 900",
       "seconds the worker waits for the engine to be ready"),
    _o("watchdog_timeout_s", _ALL, "flag", "--watchdog-timeout", _seconds, "the engine's (300)",
       "Set watchdog timeout in seconds. If a forward batch takes longer than this, the server "
       "will crash to prevent hanging."),
    _o("disable_piecewise_cuda_graph", _ALL, "flag", None, _boolean,
       "true above width 1; true at every width on sglang-cu130",
       "turns off the prefill CUDA graph: --disable-prefill-cuda-graph (SGLang 0.5.20 and "
       "later), --disable-piecewise-cuda-graph (before)"),
    _o("nccl_port", _ALL, "worker", "--nccl-port", _integer(1024, 65535),
       "a free port, 30400-30499",
       "The port for NCCL distributed environment setup. Only above width 1."),
    _o("disable_cuda_graph", _ALL, "flag", None, _boolean, "false",
       "turns CUDA graphs off entirely: --cuda-graph-backend-{decode,prefill} disabled (SGLang "
       "0.5.19 and later), --disable-cuda-graph (before)"),
    # What SIE's SGLang adapters take besides.
    _o("mem_fraction_static", _ALL, "flag", "--mem-fraction-static", _fraction,
       "SGLang's (sized from the GPU; SIE passes 0.85)",
       "The fraction of the memory used for static allocation (model weights and KV cache "
       "memory pool)."),
    _o("max_seq_length", _ALL, "flag", "--context-length", _integer(1, 2**31 - 1),
       "max_sequence_length, else tasks.generate.context_length, else the model's config.json",
       "The model's maximum context length."),
    _o("compute_precision", _ALL, "flag", "--dtype", _precision, "the profile's compute_precision",
       "Data type for model weights and activations (overrides the profile's)."),
    _o("revision", _ALL, "flag", "--revision", _revision, "hf_revision",
       "The specific model version to use (overrides hf_revision)."),
    _o("trust_remote_code", _ALL, "flag", "--trust-remote-code", _boolean, "true (as in SIE)",
       "Whether or not to allow for custom models defined on the Hub in their own modeling "
       "files."),
    _o("served_model_name", _GEN, "worker", "--served-model-name", _text,
       "the served id",
       "SIE's name for the engine, which clients never see; the worker names the engine after "
       "the served id (sie_id, or sie_id:profile) so answers carry the id the client asked "
       "for and SGLang never reads ':profile' as a LoRA adapter"),
    _o("attention_backend", _GEN, "flag", "--attention-backend",
       _choice_of("--attention-backend"), "SGLang's", "Choose the kernels for attention layers."),
    _o("grammar_backend", _GEN, "flag", "--grammar-backend",
       _choice_of("--grammar-backend", nullable=True), "SGLang's (xgrammar; SIE passes outlines)",
       "Choose the backend for grammar-guided decoding."),
    _o("reasoning_parser", _GEN, "flag", "--reasoning-parser", _choice_of("--reasoning-parser"),
       "none", "Specify the parser for reasoning models."),
    _o("tool_call_parser", _GEN, "flag", "--tool-call-parser", _choice_of("--tool-call-parser"),
       "none", "Specify the parser for handling tool-call interactions."),
    _o("speculative", _GEN, "flag", "--speculative-algorithm", _speculative, "off",
       "{enabled, algorithm, num_steps, eagle_topk, num_draft_tokens, draft_model, "
       "draft_model_revision} -> --speculative-* (and SGLANG_ENABLE_SPEC_V2=1)"),
    _o("speculative_needs_extra_buffer", _GEN, "worker", None, _boolean, "true",
       "with speculative enabled, extra_launch_args must set the release's mamba radix cache "
       "strategy (--mamba-scheduler-strategy before SGLang 0.5.20, "
       "--mamba-radix-cache-strategy after) to extra_buffer; false skips the check"),
    _o("chat_template", frozenset({"chat"}), "flag", "--chat-template", _template,
       "the tokenizer's",
       "The builtin chat template name or the path of the chat template file."),
    _o("default_sampling", _GEN, "worker", None, _sampling, "none",
       "request sampling defaults, as runtime.default_sampling (which wins)"),
    _o("stop_tokens", _GEN, "worker", None, _stops, "none",
       "stop strings added to requests, as runtime.stop_tokens (which wins)"),
    _o("json_number_max_digits", _GEN, "hook", None, _integer(1), "none",
       f"bounds the digits of JSON numbers under xgrammar: {_SIE_HOOK}"),
    _o("thinking_budget", _GEN, "hook", None, _integer(1), "none",
       f"closes the reasoning block after N tokens: {_SIE_HOOK}"),
    _o("guard", _GEN, "hook", None, _guard, "none",
       f"a guard model's Yes/No verdict from logprobs: {_SIE_HOOK}"),
    _o("mlx_repo", _ALL, "inert", None, _text, "none",
       "the MLX repository SIE serves on Apple silicon; no effect on CUDA"),
    _o("config_kwargs", _ALL, "inert", None, _mapping, "none",
       "Hugging Face config overrides; SIE's SGLang adapters ignore them too"),
    _o("lora_paths", _ALL, "later", "--lora-paths", _later("multi-LoRA serving, issue 22"), "none",
       "The list of LoRA adapters to load."),
    _o("max_loras_per_batch", _ALL, "later", "--max-loras-per-batch",
       _later("multi-LoRA serving, issue 22"), "SIE: 4 (generation), 8 (embedding)",
       "Maximum number of adapters for a running batch, include base-only request."),
    # SIE's embedding adapter.
    _o("dense_dim", _EMB, "inert", None, _integer(1), "tasks.encode.dense.dim",
       "the vector width SIE checks its answers against"),
    _o("normalize", _EMB, "hook", None, _boolean, "true", f"L2-normalise vectors: {_SIE_REQUEST}"),
    _o("query_template", _EMB, "hook", None, _text, "none", f"query formatting: {_SIE_REQUEST}"),
    _o("doc_template", _EMB, "hook", None, _text, "none", f"document formatting: {_SIE_REQUEST}"),
    _o("default_instruction", _EMB, "hook", None, _text, "none",
       f"query instruction: {_SIE_REQUEST}"),
    _o("append_eos", _EMB, "hook", None, _boolean, "false",
       f"append the tokenizer's EOS to every text: {_SIE_REQUEST}"),
    _o("embed_concurrency", _EMB, "inert", None, _integer(1), "8",
       "SIE's concurrent POSTs per batch; the worker relays each request as it comes"),
    _o("max_concurrent_dispatch", _EMB, "inert", None, _integer(1), "1",
       "SIE's batches in flight; the worker relays each request as it comes"),
)  # fmt: skip
SGLANG_OPTIONS: Mapping[str, SGLangOption] = {option.name: option for option in _TABLE}


def options_for(family: Family) -> tuple[str, ...]:
    """The load-time option names an adapter family accepts, in table order."""
    return tuple(o.name for o in _TABLE if family in o.families)


def option_problem(name: str, value: Any, release: Release) -> str | None:
    """Why this option's value breaks its rule (or needs a flag the release lacks), or None."""
    option = SGLANG_OPTIONS[name]
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
            "from a bundle whose SGLang has it"
        )
    return None


def speculative_args(spec: Mapping[str, Any]) -> tuple[str, ...]:
    """The ``--speculative-*`` flags of an (already checked) enabled ``speculative`` block."""
    if spec.get("enabled") is not True:
        return ()
    args = ["--speculative-algorithm", str(spec["algorithm"]).strip().upper()]
    for key in ("num_steps", "eagle_topk", "num_draft_tokens"):
        if key in spec:
            args += [SPECULATIVE_KEYS[key], str(spec[key])]
    draft = spec.get("draft_model")
    if isinstance(draft, str) and draft.strip():
        args += [SPECULATIVE_KEYS["draft_model"], draft.strip()]
        revision = spec.get("draft_model_revision")
        if isinstance(revision, str):
            args += [SPECULATIVE_KEYS["draft_model_revision"], revision]
    return tuple(args)
