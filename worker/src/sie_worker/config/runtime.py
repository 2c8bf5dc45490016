"""Runtime options (``adapter_options.runtime``): what a profile adds to every request.

Read time (:func:`runtime_problems`): the options the worker applies are checked as SIE
checks them, so a bad one fails the config instead of every request:

- ``default_sampling``: ``temperature`` (finite, >= 0), ``top_p`` (0 < p <= 1),
  ``frequency_penalty`` and ``presence_penalty`` (-2..2), ``top_k`` (integer >= 1),
  ``min_new_tokens`` (integer >= 0), ``seed`` (64-bit integer); nothing else;
- ``stop_tokens``: a list of nonempty strings;
- ``first_chunk_timeout_s``, ``inter_chunk_timeout_s``, ``overall_timeout_s``: finite numbers
  of seconds above zero (below 2^64).

Request time (:class:`RequestRuntime`, pure): for ``/v1/completions`` and
``/v1/chat/completions`` bodies, ``default_sampling`` fills the fields the client left unset
(``min_new_tokens`` is ``min_tokens``, never above the request's ``max_tokens``); a
grammar-constrained request (a ``response_format`` other than text, or SGLang's ``regex``,
``ebnf``, ``json_schema``) gets ``temperature``, ``presence_penalty`` and
``frequency_penalty`` 0 above the profile's defaults, as in SIE; ``stop_tokens`` are added to
the request's ``stop`` (no duplicates); chat requests get the served model's
``chat_template_kwargs`` over their own (the config wins). The timeouts are the proxy's
(:class:`Timeouts`): time to the first chunk, longest silence between chunks, whole answer.
Other runtime keys belong to the adapter and are passed over.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from sie_worker.config.files.jsonpath import json_path
from sie_worker.config.files.values import described, shown
from sie_worker.config.model import JsonPath, ServedModel
from sie_worker.errors import Problem

__all__ = [
    "GRAMMAR_SAMPLING",
    "SAMPLING_FIELDS",
    "TIMEOUT_KEYS",
    "RequestRuntime",
    "Timeouts",
    "is_grammar_constrained",
    "request_runtime",
    "runtime_problems",
    "sampling_problem",
    "stops_problem",
    "timeout_problem",
]

# SIE's default_sampling keys -> the OpenAI / SGLang request field each one fills.
SAMPLING_FIELDS: Mapping[str, str] = {
    "temperature": "temperature",
    "top_p": "top_p",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
    "top_k": "top_k",
    "min_new_tokens": "min_tokens",
    "seed": "seed",
}
GRAMMAR_SAMPLING: Mapping[str, float] = {
    "temperature": 0.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}
TIMEOUT_KEYS = ("first_chunk_timeout_s", "inter_chunk_timeout_s", "overall_timeout_s")
_MAX_TIMEOUT_S = 2.0**64
_GRAMMAR_FIELDS = ("regex", "ebnf", "json_schema", "structural_tag")
_GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")
_CHAT_PATH = "/v1/chat/completions"


def _finite(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_SAMPLING_RULES: Mapping[str, tuple[str, Any]] = {
    "temperature": ("a finite number of at least 0", lambda v: _finite(v) and v >= 0),
    "top_p": ("a number above 0 and at most 1", lambda v: _finite(v) and 0 < v <= 1),
    "frequency_penalty": ("a number from -2 to 2", lambda v: _finite(v) and -2 <= v <= 2),
    "presence_penalty": ("a number from -2 to 2", lambda v: _finite(v) and -2 <= v <= 2),
    "top_k": ("an integer of at least 1", lambda v: _integer(v) and v >= 1),
    "min_new_tokens": ("an integer of at least 0", lambda v: _integer(v) and v >= 0),
    "seed": ("a 64-bit integer", lambda v: _integer(v) and -(2**63) <= v < 2**63),
}


def sampling_problem(value: Any) -> str | None:
    """Why a ``default_sampling`` block is refused (every bad key, one message), or None."""
    if not isinstance(value, dict):
        return f"must be a mapping of sampling defaults, got {described(value)}"
    problems = []
    for key, item in value.items():
        rule = _SAMPLING_RULES.get(key)
        if rule is None:
            close = difflib.get_close_matches(str(key), list(SAMPLING_FIELDS), n=1, cutoff=0.6)
            hint = f"did you mean {close[0]}?" if close else "keys: " + ", ".join(SAMPLING_FIELDS)
            problems.append(f"{key!r} is not a sampling default SIE applies; {hint}")
        elif not rule[1](item):
            problems.append(f"{key} must be {rule[0]}, got {described(item)}")
    return "; ".join(problems) or None


def stops_problem(value: Any) -> str | None:
    if not isinstance(value, list):
        return f"must be a list of nonempty strings, got {described(value)}"
    bad = [
        f"item {i} is {described(t)}" for i, t in enumerate(value) if not (isinstance(t, str) and t)
    ]
    return "must be a list of nonempty strings: " + ", ".join(bad) if bad else None


def timeout_problem(value: Any) -> str | None:
    expected = "must be a finite number of seconds above zero"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{expected}, got {described(value)}"
    if not _finite(value) or value <= 0 or float(value) >= _MAX_TIMEOUT_S:
        return f"{expected}, got {shown(value)}"
    return None


def runtime_problems(runtime: Mapping[str, Any], base: JsonPath) -> list[Problem]:
    """The problems of one profile's own runtime block (``base`` is its JSON path)."""
    problems: list[Problem] = []
    checks = {"default_sampling": sampling_problem, "stop_tokens": stops_problem}
    checks |= dict.fromkeys(TIMEOUT_KEYS, timeout_problem)
    for key, check in checks.items():
        if key in runtime:
            message = check(runtime[key])
            if message is not None:
                problems.append(Problem(json_path([*base, key]), message))
    return problems


# --- request time ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Timeouts:
    """The proxy's limits for one request, in seconds; None leaves one off."""

    first_chunk_s: float | None = None
    inter_chunk_s: float | None = None
    overall_s: float | None = None

    @property
    def any(self) -> bool:
        return any(t is not None for t in (self.first_chunk_s, self.inter_chunk_s, self.overall_s))


def is_grammar_constrained(body: Mapping[str, Any]) -> bool:
    """Whether a request constrains decoding: a ``response_format`` other than text, or
    SGLang's ``regex``, ``ebnf``, ``json_schema``, ``structural_tag``."""
    response_format = body.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") not in (None, "text"):
        return True
    return any(body.get(key) is not None for key in _GRAMMAR_FIELDS)


@dataclass(frozen=True)
class RequestRuntime:
    """What a served model's profile adds to its requests. Pure."""

    default_sampling: Mapping[str, Any] = field(default_factory=dict)
    stop_tokens: tuple[str, ...] = ()
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    timeouts: Timeouts = Timeouts()

    @property
    def rewrites(self) -> bool:
        """Whether any request body may change (else bodies are forwarded as sent)."""
        return bool(self.default_sampling or self.stop_tokens or self.chat_template_kwargs)

    def rewrite(self, path: str, body: bytes) -> bytes:
        """``body`` as forwarded to the engine (unchanged when nothing applies or it is not a
        JSON object: the engine then says what is wrong)."""
        if not self.rewrites or path not in _GENERATION_PATHS:
            return body
        try:
            payload = json.loads(body)
        except (ValueError, RecursionError):
            return body
        if not isinstance(payload, dict):
            return body
        changed = self.apply(path, payload)
        return body if changed == payload else json.dumps(changed).encode()

    def apply(self, path: str, payload: Mapping[str, Any]) -> dict[str, Any]:
        """A new request body with the profile's defaults, stops and template arguments."""
        out = dict(payload)
        sampling = dict(self.default_sampling)
        if is_grammar_constrained(payload):
            sampling |= GRAMMAR_SAMPLING
        cap = _output_cap(payload)
        for key, target in SAMPLING_FIELDS.items():
            if key in sampling and out.get(target) is None:
                value = sampling[key]
                if key == "min_new_tokens" and cap is not None and value > cap:
                    value = cap  # a profile's minimum is a soft default (SIE clamps it too)
                out[target] = value
        if self.stop_tokens:
            stop = out.get("stop")
            if stop is None:
                out["stop"] = list(self.stop_tokens)
            elif isinstance(stop, str | list):
                merged = [stop] if isinstance(stop, str) else list(stop)
                merged += [t for t in self.stop_tokens if t not in merged]
                out["stop"] = merged
        if self.chat_template_kwargs and path == _CHAT_PATH:
            own = out.get("chat_template_kwargs")
            out["chat_template_kwargs"] = {
                **(own if isinstance(own, dict) else {}),
                **self.chat_template_kwargs,
            }
        return out


def _output_cap(payload: Mapping[str, Any]) -> int | None:
    for key in ("max_completion_tokens", "max_tokens"):
        value = payload.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def request_runtime(served: ServedModel) -> RequestRuntime:
    """The request runtime of a served model: its resolved runtime block (with the loadtime
    ``default_sampling`` / ``stop_tokens`` SIE also accepts, under the runtime ones)."""
    profile = served.profile
    runtime, loadtime = profile.runtime, profile.loadtime
    sampling = runtime.get("default_sampling", loadtime.get("default_sampling"))
    stops = runtime.get("stop_tokens", loadtime.get("stop_tokens"))
    seconds = [runtime.get(key) for key in TIMEOUT_KEYS]
    kwargs = served.chat_template_kwargs if "generate" in served.config.tasks else {}
    return RequestRuntime(
        default_sampling=MappingProxyType(dict(sampling)) if isinstance(sampling, dict) else {},
        stop_tokens=tuple(stops) if isinstance(stops, list) else (),
        chat_template_kwargs=kwargs,
        timeouts=Timeouts(
            *(float(s) if isinstance(s, int | float) and _finite(s) else None for s in seconds)
        ),
    )
