"""What a hop keeps of an OpenAI stream (or SIE's generate stream) it relays, so that it
can resume it on another backend (DESIGN.md, "Resuming a stream"; the resumption itself:
:mod:`sie_worker.http.resume`).

Every relayed event crosses this, so the hot path parses nothing: :meth:`StreamMemory.feed`
passes whole events only (an unfinished one waits for the rest of it, as the worker's own
check does), keeps their bytes, notes ``[DONE]`` and holds back an error event (the hop may
resume instead of passing it on). An error event ends what its sender sends (the worker
ends the stream after it; an engine sends at most ``[DONE]`` after it), so only the last
two events of each read are searched for one. Past :data:`COMPACT_AT` the kept bytes are
compressed (zlib, fastest level: SSE events repeat their id, model and keys, so a long
stream costs the hop a small share of its events' size). The bytes are read as JSON only
when the stream must be resumed. ``docs/benchmarks.md`` ("Stream resumption: keeping the
text") has the cost per event, beside a relay that keeps nothing.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from typing import Any

__all__ = [
    "COMPACT_AT",
    "DONE_EVENT",
    "IDENTITY",
    "StreamMemory",
    "event_payloads",
    "is_error_event",
]

DONE_EVENT = b"data: [DONE]\n\n"
# What names the one answer a client sees: OpenAI's id, created and model; SIE's request_id.
IDENTITY = ("id", "created", "model", "request_id")
# Kept event bytes past which they are compressed: the most a relay holds of a stream for
# a slow client too (RelayLimits.high_water), so most streams are never compressed.
COMPACT_AT = 1024 * 1024


def _nothing() -> None:
    return None


def event_payloads(events: bytes) -> list[bytes]:
    """The ``data:`` payload of each whole event in ``events`` (one per event; an event
    of several ``data:`` lines has them joined by newlines, as SSE says)."""
    payloads = []
    for event in events.split(b"\n\n"):
        lines = [line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:")]
        if lines:
            payloads.append(b"\n".join(lines))
    return payloads


def is_error_event(payload: bytes) -> dict[str, Any] | None:
    """The error object of an error event (``{"error": {...}}``, ours and the engines';
    ``{"object": "error", ...}``, older vLLM's), else None."""
    if not payload.startswith(b"{"):
        return None
    try:
        document = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(document, dict):
        return None
    error = document.get("error")
    if isinstance(error, dict) and "choices" not in document:
        return error
    if document.get("object") == "error":
        return document
    return None


class StreamMemory:
    """One relayed stream, as far as its client has seen it (see the module docstring).

    ``rewrite`` (set by a resumption) turns whole events from the current backend into
    what the client gets; ``stop`` ends the reading of the current backend (called when
    an error event comes)."""

    __slots__ = (
        "_fresh",
        "_packed",
        "_pending",
        "_raw",
        "_raw_bytes",
        "_zip",
        "done",
        "error",
        "finish",
        "identity",
        "kind",
        "last_seq",
        "pieces",
        "rewrite",
        "role_sent",
        "stop",
        "tokens",
        "unresumable",
        "usage_seen",
        "usage_tokens",
        "withheld",
    )

    def __init__(self, kind: str) -> None:
        self.kind = kind  # completions, chat or generate (SIE's)
        self._raw: list[bytes] = []
        self._raw_bytes = 0
        self._packed: list[bytes] = []  # older events, compressed by _zip
        self._zip: Any = None
        self._fresh = True  # the summary below is of every kept event
        self._pending = b""
        self.pieces: list[str] = []  # the text the client has, in order
        self.tokens = 0  # completion tokens the client has, counted by events
        self.usage_tokens: int | None = None  # ... as the last usage the client got says
        self.identity: dict[str, Any] = {}  # the first answer's id, created, model
        self.last_seq = -1  # SIE's generate: the seq of the client's last event
        self.finish: str | None = None
        self.role_sent = False
        self.usage_seen = False
        self.unresumable: str | None = None
        self.done = False  # the client has [DONE]
        self.error: dict[str, Any] | None = None  # the error event held back
        self.withheld = b""  # its bytes, and what came after it
        self.rewrite: Callable[[bytes], bytes] | None = None
        self.stop: Callable[[], None] = _nothing

    def feed(self, data: bytes) -> bytes:
        """What of ``data`` (with what was pending) leaves for the client now."""
        if self.error is not None:
            return b""
        if self._pending:
            data = self._pending + data
            self._pending = b""
        cut = data.rfind(b"\n\n") + 2
        if cut == 1:
            self._pending = data
            return b""
        if cut != len(data):
            self._pending = data[cut:]
            data = data[:cut]
        # Searched from the start of the last two events (the last one ends the data).
        last = data.rfind(b"\n\n", 0, data.rfind(b"\n\n", 0, cut - 2))
        if data.find(b'"error"', last if last > 0 else 0) >= 0:
            data = self._hold_back_error(data)
        if self.rewrite is not None and data:
            data = self.rewrite(data)
        if data:
            self._raw.append(data)
            self._raw_bytes += len(data)
            self._fresh = False
            if data.endswith(DONE_EVENT):
                self.done = True
            if self._raw_bytes > COMPACT_AT:
                self._pack()
        return data

    def _pack(self) -> None:
        if self._zip is None:
            self._zip = zlib.compressobj(1)
        self._packed.append(self._zip.compress(b"".join(self._raw)))
        self._raw.clear()
        self._raw_bytes = 0

    def end(self) -> bytes:
        """The bytes of an unfinished last event, when the stream ended without resuming."""
        pending, self._pending = self._pending, b""
        return pending

    def next_backend(self) -> None:
        """Forget the failed backend's unfinished event and error: a resumption starts."""
        self._pending = b""
        self.error = None
        self.withheld = b""
        self.stop = _nothing

    @property
    def text(self) -> str:
        self.summarize()
        return "".join(self.pieces)

    @property
    def sent_tokens(self) -> int:
        """The completion tokens the client has: its last usage's, else counted events."""
        self.summarize()
        return self.tokens if self.usage_tokens is None else self.usage_tokens

    def summarize(self) -> None:
        """Read every kept event into the text and counts they carry (the summary)."""
        if self._fresh:
            return
        raw = b"".join(self._raw)
        if self._packed:
            self._packed.append(self._zip.flush(zlib.Z_SYNC_FLUSH))
            raw = zlib.decompressobj().decompress(b"".join(self._packed)) + raw
        self.pieces, self.tokens, self.usage_tokens, self.identity = [], 0, None, {}
        self.last_seq, self.finish, self.role_sent, self.usage_seen = -1, None, False, False
        self.unresumable = None
        for payload in event_payloads(raw):
            if payload == b"[DONE]":
                continue
            try:
                document = json.loads(payload)
            except ValueError:
                self.unresumable = "an event that is not JSON"
                continue
            if isinstance(document, dict):
                self._note(document)
        self._fresh = True

    @property
    def chat(self) -> bool:
        return self.kind == "chat"

    def _note(self, document: dict[str, Any]) -> None:
        if not self.identity:
            self.identity = {k: document[k] for k in IDENTITY if k in document}
        if self.kind == "generate":
            self._note_sie(document)
            return
        usage = document.get("usage")
        choices = document.get("choices")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            self.usage_tokens = usage["completion_tokens"]
            if not choices:
                self.usage_seen = True
        if not isinstance(choices, list):
            return
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            if choice.get("index", 0) != 0:
                self.unresumable = "several choices (n > 1)"
                continue
            if choice.get("finish_reason") is not None:
                self.finish = choice["finish_reason"]
            text = self._text_of(choice)
            if text:
                self.pieces.append(text)
                self.tokens += 1

    def _note_sie(self, document: dict[str, Any]) -> None:
        """An event of SIE's generate stream: ``{request_id, seq, text_delta, done}``, the
        last one with ``finish_reason`` and ``usage``."""
        if isinstance(document.get("seq"), int):
            self.last_seq = document["seq"]
        if document.get("done") is True:
            self.finish = str(document.get("finish_reason") or "stop")
            usage = document.get("usage")
            if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
                self.usage_tokens, self.usage_seen = usage["completion_tokens"], True
            return
        text = document.get("text_delta")
        if isinstance(text, str) and text:
            self.pieces.append(text)
            self.tokens += 1

    def _text_of(self, choice: dict[str, Any]) -> str | None:
        if not self.chat:
            text = choice.get("text")
            return text if isinstance(text, str) else None
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return None
        if delta.get("role") is not None:
            self.role_sent = True
        if delta.get("tool_calls") or delta.get("reasoning_content") or delta.get("reasoning"):
            self.unresumable = "tool calls or reasoning in the answer"
        content = delta.get("content")
        return content if isinstance(content, str) else None

    def _hold_back_error(self, events: bytes) -> bytes:
        """``events`` up to the first error event; that one and the rest are held back."""
        start = 0
        while start < len(events):
            end = events.find(b"\n\n", start) + 2
            event = events[start:end]
            for payload in event_payloads(event):
                error = is_error_event(payload)
                if error is not None:
                    self.error = error
                    self.withheld = events[start:]
                    self.stop()
                    return events[:start]
            start = end
        return events
