"""Resuming a relayed OpenAI stream on another backend when its backend fails mid-stream
(DESIGN.md, "Resuming a stream"): one module for the slot router and the gateway, used by
:mod:`sie_worker.http.relay`.

A streamed ``POST /v1/completions`` or ``/v1/chat/completions`` whose backend fails after
its answer's head (the connection lost, the backend leaving rotation, an error event, a
stream cut before ``[DONE]``), or whose backend answers the worker's ``not_leader`` or an
engine failure, or drops the connection, before it, is sent to another backend: as it came
when the client has no event yet, else as its continuation: the prompt plus
the text the client has (completions), or the messages plus the partial assistant message
with ``continue_final_message: true, add_generation_prompt: false`` (chat), ``max_tokens``
less the tokens the client has. The continuation's events are rewritten so that the client
sees one answer: the first answer's ``id``, ``created`` and ``model``, no second role
delta, and usage that counts the prompt once (the continuation's prompt less the tokens it
carries over) and every completion token once. At most ``resume_max`` resumptions per
request, within its deadline; ``X-SIE-Resume: off`` opts a request out. SIE's generate
stream (``POST /v1/generate/<model>``, JSON or MessagePack) resumes the same way: its
prompt plus the text sent, ``max_new_tokens`` less the tokens sent, the events keeping the
first answer's ``request_id`` and numbering ``seq`` on.

A non-streamed request is never resent once a backend may have it: its answer is one
document, and an engine that failed halfway leaves nothing a hop could continue from.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgpack

from sie_worker.http.stream_memory import DONE_EVENT, IDENTITY, StreamMemory, event_payloads

__all__ = [
    "REASONS",
    "RESUME_HEADER",
    "Plan",
    "Request",
    "Resumer",
    "Rewrite",
    "opted_out",
    "plan",
    "refusal_reason",
]

_log = logging.getLogger("sie_worker.resume")
RESUME_HEADER = "x-sie-resume"
_OFF = frozenset({"off", "false", "0", "no"})
# Path -> the kind of its stream (and SIE's generate, under /v1/generate/<model>).
_PATHS = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}
_SIE_GENERATE = "/v1/generate/"
# A backend's answers before any event that mean its engine never generated anything:
# X-SIE-Error-Code -> the reason a resumption counts.
_REFUSALS = {"NOT_LEADER": "not_leader", "INFERENCE_ERROR": "engine_failed"}
_MAX_KEYS = ("max_tokens", "max_completion_tokens", "max_new_tokens")
# Why a stream was resumed: the label values of sie_{router,gateway}_resumes_total.
REASONS = (
    "connection_lost",  # the backend's connection broke mid-stream
    "backend_down",  # the backend left rotation (missed polls) mid-stream
    "error_event",  # the backend ended the stream with an error event
    "truncated",  # the stream ended without [DONE]
    "not_leader",  # a rank >= 1 of a group of nodes answered before any event
    "engine_failed",  # the backend's engine failed before any event
    "refused",  # a resumption's backend answered something other than a stream
)


def opted_out(headers: Iterable[tuple[str, str]]) -> bool:
    """Whether the request says ``X-SIE-Resume: off``."""
    return any(k.lower() == RESUME_HEADER and v.strip().lower() in _OFF for k, v in headers)


def refusal_reason(status: int, headers: Sequence[tuple[str, str]]) -> str | None:
    """The resumption reason of a backend's answer before any event, or None when the
    answer is the client's (relayed as it is)."""
    if status < 400:
        return None
    code = next((v for k, v in headers if k.lower() == "x-sie-error-code"), "")
    return _REFUSALS.get(code.strip())


@dataclass
class Rewrite:
    """The continuation's events as the client gets them (see the module docstring).
    ``tail``: the client has the whole text; only the finish and usage are wanted."""

    identity: dict[str, Any]
    base: int  # completion tokens the client had when this continuation started
    kind: str  # completions, chat, generate
    drop_role: bool
    tail: bool = False
    drop_finish: bool = False
    seq: int = 0  # SIE's generate: the seq of the next event the client gets

    def __call__(self, events: bytes) -> bytes:
        out = []
        for payload in event_payloads(events):
            if payload == b"[DONE]":
                out.append(DONE_EVENT)
                continue
            try:
                document = json.loads(payload)
            except ValueError:
                document = None
            if not isinstance(document, dict):
                out.append(b"data: " + payload + b"\n\n")
                continue
            kept = self._event(document)
            if kept is not None:
                text = json.dumps(kept, ensure_ascii=False, separators=(",", ":"))
                out.append(b"data: " + text.encode() + b"\n\n")
        return b"".join(out)

    def _event(self, document: dict[str, Any]) -> dict[str, Any] | None:
        if not self.identity:
            self.identity = {k: document[k] for k in IDENTITY if k in document}
        for key, value in self.identity.items():
            if key in document:
                document[key] = value
        usage = document.get("usage")
        if isinstance(usage, dict):
            self._usage(usage)
        if self.kind == "generate":
            if self.tail and document.get("done") is not True:
                return None
            if "seq" in document:
                document["seq"], self.seq = self.seq, self.seq + 1
            return document
        choices = document.get("choices")
        if isinstance(choices, list) and choices:
            document["choices"] = [c for c in choices if isinstance(c, dict) and self._keep(c)]
            if not document["choices"] and not isinstance(usage, dict):
                return None
        return document

    def _usage(self, usage: dict[str, Any]) -> None:
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if not isinstance(prompt, int) or not isinstance(completion, int):
            return
        usage["prompt_tokens"] = max(prompt - self.base, 0)
        usage["completion_tokens"] = self.base if self.tail else self.base + completion
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]

    def _keep(self, choice: dict[str, Any]) -> bool:
        finish = choice.get("finish_reason")
        delta = choice.get("delta")
        if self.tail:
            if finish is None or self.drop_finish:
                return False
            if self.kind == "chat" and isinstance(delta, dict):
                choice["delta"] = {}
            elif self.kind == "completions":
                choice["text"] = ""
            return True
        chat = self.kind == "chat"
        if chat and self.drop_role and isinstance(delta, dict) and "role" in delta:
            del delta["role"]
            other = set(delta) - {"content"}  # anything but the (empty) content of a role delta
            return bool(delta.get("content")) or finish is not None or bool(other)
        return True


@dataclass(frozen=True)
class Plan:
    """A resumption: ``body`` for the next backend (None: the client has the whole answer
    but ``[DONE]``), and the rewrite of its events."""

    body: bytes | None
    rewrite: Rewrite


def plan(original: bytes, memory: StreamMemory, *, packed: bool = False) -> Plan | str:
    """The continuation of the stream ``memory`` has kept, or why there is none;
    ``packed``: the body is MessagePack (SIE's), else JSON."""
    request = _decode(original, packed)
    if request is None:
        return "its body cannot be read"
    if not isinstance(request, dict) or request.get("stream") is not True:
        return "it is not a stream"
    if request.get("n") not in (None, 1) or request.get("best_of") not in (None, 1):
        return "it asks for several choices"
    memory.summarize()
    if memory.unresumable is not None:
        return f"its answer has {memory.unresumable}"
    text, sent = memory.text, memory.sent_tokens
    sie = memory.kind == "generate"
    options = request.get("stream_options")
    wants_usage = isinstance(options, dict) and options.get("include_usage") is True
    rewrite = Rewrite(dict(memory.identity), sent, memory.kind, drop_role=memory.role_sent)
    rewrite.seq = memory.last_seq + 1
    limits = {k: request[k] for k in _MAX_KEYS if isinstance(request.get(k), int)}
    left = min((v - sent for v in limits.values()), default=None)
    if memory.finish is not None or (left is not None and left <= 0):
        if memory.finish is not None and (memory.usage_seen or not wants_usage or sie):
            return Plan(None, rewrite)
        # Only the finish and usage are missing: ask for one token, and keep none of it.
        rewrite.tail, rewrite.drop_finish = True, memory.finish is not None
        left = 1
    if not text and not rewrite.tail:
        return Plan(original, rewrite)  # nothing generated yet: the request as it came
    continued = _continued(request, text, memory.kind)
    if isinstance(continued, str):
        return continued
    for key in limits:
        continued[key] = max(left or 1, 1)
    if isinstance(continued.get("min_tokens"), int):
        continued["min_tokens"] = max(continued["min_tokens"] - sent, 0)
    if packed:
        return Plan(msgpack.packb(continued, use_bin_type=True), rewrite)
    return Plan(json.dumps(continued, ensure_ascii=False).encode(), rewrite)


def _decode(body: bytes, packed: bool) -> dict[str, Any] | None:
    try:
        request = msgpack.unpackb(body, raw=False) if packed else json.loads(body)
    except (ValueError, TypeError, msgpack.UnpackException):
        return None
    return request if isinstance(request, dict) else None


def _continued(request: dict[str, Any], text: str, kind: str) -> dict[str, Any] | str:
    continued = dict(request)
    if kind == "generate":
        prompt = request.get("prompt")
        if not isinstance(prompt, str):
            return "its prompt is not one text"
        continued["prompt"] = prompt + text
        return continued
    if kind == "completions":
        if request.get("echo"):
            return "it asks for the prompt echoed"
        prompt = request.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            continued["prompt"] = [prompt[0] + text]
        elif isinstance(prompt, str):
            continued["prompt"] = prompt + text
        else:
            return "its prompt is not one text"
        return continued
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        return "it has no messages"
    messages = list(messages)
    last = messages[-1]
    if (
        request.get("continue_final_message") is True
        and isinstance(last, dict)
        and last.get("role") == "assistant"
        and isinstance(last.get("content"), str)
    ):
        messages[-1] = {**last, "content": last["content"] + text}
    else:
        messages.append({"role": "assistant", "content": text})
    continued["messages"] = messages
    continued["continue_final_message"] = True
    continued["add_generation_prompt"] = False
    return continued


class Request(Protocol):
    """What a resumer reads of the relayed request (:class:`sie_worker.http.relay.Upstream`)."""

    @property
    def method(self) -> str: ...
    @property
    def target(self) -> str: ...
    @property
    def headers(self) -> tuple[tuple[str, str], ...]: ...
    @property
    def body(self) -> bytes: ...


@dataclass
class Resumer:
    """One request's resumptions: its memory of the stream, what it may still do (``left``
    resumptions until ``deadline``, monotonic), and the plan of the next try."""

    original: bytes
    kind: str
    packed: bool  # the body is MessagePack (SIE's)
    left: int
    deadline: float
    count: Callable[[str], None] | None
    request_id: str
    memory: StreamMemory = field(init=False)
    body: bytes | None = None  # what the next try sends (None: the original)
    complete: bool = False  # the client has the whole answer but [DONE]: no next try
    reason: str | None = None  # why the next try is a resumption
    failed: str = ""  # the backend it broke off on
    count_done: int = 0

    def __post_init__(self) -> None:
        self.memory = StreamMemory(self.kind)

    @classmethod
    def of(
        cls,
        request: Request,
        resume_max: int,
        within_s: float,
        count: Callable[[str], None] | None,
    ) -> Resumer | None:
        """The resumer of a request the hop may resume (at most ``resume_max`` times, for
        ``within_s`` from now, each counted by ``count``), else None."""
        path = request.target.split("?", 1)[0]
        kind = "generate" if path.startswith(_SIE_GENERATE) else _PATHS.get(path)
        headers = request.headers
        if kind is None or request.method != "POST" or resume_max <= 0 or opted_out(headers):
            return None
        found = {k.lower(): v for k, v in headers if k.lower() in ("x-request-id", "content-type")}
        packed = "msgpack" in found.get("content-type", "")
        deadline = time.monotonic() + within_s
        request_id = found.get("x-request-id", "-")
        return cls(request.body, kind, packed, resume_max, deadline, count, request_id)

    def streamed(self) -> bool:
        """Whether the request asks for a stream (read once a backend refused it)."""
        request = _decode(self.original, self.packed)
        return request is not None and request.get("stream") is True

    def again(self, reason: str, failed: str) -> bool:
        """Whether the stream, broken off on ``failed`` for ``reason``, may resume
        elsewhere (the next try's body is set; it counts once a backend takes it)."""
        if self.left <= 0 or time.monotonic() >= self.deadline:
            return False
        planned = plan(self.original, self.memory, packed=self.packed)
        if isinstance(planned, str):
            _log.warning(
                "request %s: the stream from %s broke off (%s) and is not resumed: %s",
                self.request_id, failed, reason, planned,
            )  # fmt: skip
            return False
        self.reason, self.failed = reason, failed
        self.body = planned.body
        self.complete = planned.body is None
        self.memory.next_backend()
        self.memory.rewrite = planned.rewrite
        if self.complete:
            self.resumed_on("this hop (only [DONE] was missing)")
        return True

    def resumed_on(self, backend: str) -> None:
        """Count and log the resumption just routed to ``backend`` (both backends named)."""
        if self.reason is None:
            return
        self.left -= 1
        self.count_done += 1
        if self.count is not None:
            self.count(self.reason)
        _log.warning(
            "request %s: stream resumed on %s after %s on %s, with %d completion tokens "
            "sent (resumption %d)",
            self.request_id, backend, self.reason, self.failed, self.memory.sent_tokens,
            self.count_done,
        )  # fmt: skip
        self.reason = None
