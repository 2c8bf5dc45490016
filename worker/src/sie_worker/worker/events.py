"""A stream's bytes on their way from the engine to the client: whole SSE events only.

An unfinished event waits for the rest; each event must be a server-sent event whose
``data:`` looks like one JSON document (or ``[DONE]``) and at most 8 MiB; SIE's translator
(``/v1/generate``) turns them into its own when there is one. A stream that breaks those
rules ends with one ``engine_unavailable`` error event, and :attr:`EventCheck.stop` is
called (the relay closes the engine connection). The check is structural, not a parse,
to keep the hot path cheap (it runs once per read, from the engine parser's callback); it
catches garbage and truncated documents.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from sie_worker.errors import EngineUnavailable, SieError
from sie_worker.http.errors import sse_error_event
from sie_worker.worker.metrics import StreamTimer

__all__ = ["MAX_EVENT_BYTES", "EventCheck", "ends_with_done", "malformation"]

_log = logging.getLogger("sie_worker.proxy")
MAX_EVENT_BYTES = 8 * 1024 * 1024
_SSE_FIELDS = (b"data:", b"event:", b"id:", b"retry:", b":")
_DONE_EVENT = b"data: [DONE]\n\n"  # the last event of an OpenAI stream


def _nothing() -> None:
    return None


class EventCheck:
    """One stream's check, fed each read of the engine's body (:meth:`feed`)."""

    __slots__ = ("_model", "_pending", "_timer", "_translate", "failed", "stop")

    def __init__(
        self,
        model: str,
        translate: Callable[[bytes], bytes] | None = None,
        timer: StreamTimer | None = None,
    ) -> None:
        self._model, self._translate, self._timer = model, translate, timer
        self._pending = b""
        self.failed = False
        self.stop: Callable[[], None] = _nothing  # what ends the stream's reading

    def feed(self, data: bytes) -> bytes:
        """What of ``data`` (with what was pending) leaves for the client now."""
        if self.failed:
            return b""
        pending = self._pending + data if self._pending else data
        # Checked before cutting: one read can hold the end of an oversized event and the
        # start of the next, and the size must not depend on where reads split.
        if len(pending) > MAX_EVENT_BYTES and _has_oversized_event(pending):
            return self._fail("an event larger than 8 MiB")
        cut = pending.rfind(b"\n\n") + 2
        if cut == 1:
            self._pending = pending
            return b""
        if cut == len(pending):
            events, self._pending = pending, b""
        else:
            events, self._pending = pending[:cut], pending[cut:]
        if not _one_json_event(events):
            problem = malformation(events)
            if problem is not None:
                return self._fail(problem)
        return self._leave(events)

    def _leave(self, events: bytes) -> bytes:
        # Where a stream's events leave for the client (once per write; the first call is
        # its first event): the bytes returned are written at once, and timed (the time to
        # the first token, then between writes).
        if self._translate is not None:
            events = self._translate(events)
        if events and self._timer is not None:
            self._timer.chunk(time.monotonic())
        return events

    def end(self, error: SieError | None) -> bytes:
        """The stream's last bytes: an error event when it failed (``error``) or was cut."""
        if self.failed:
            return b""
        if error is not None:
            _log.warning("stream from %s ended: %s", self._model, error.message)
            return (b"\n\n" if self._pending else b"") + sse_error_event(error)
        if self._pending.strip():
            return self._fail("a truncated event")
        return b""

    def _fail(self, what: str) -> bytes:
        self.failed = True
        self.stop()
        error = EngineUnavailable(f"{self._model}: engine sent {what}; stream closed")
        _log.warning("%s", error.message)
        return sse_error_event(error)


def ends_with_done(chunk: bytes, previous: bytes) -> bool:
    """Whether the stream's ``[DONE]`` event ends with ``chunk``. The client's answer ends
    there, before the engine's end of body; the engine connection is read on to that end
    and kept for the next stream (:class:`~sie_worker.http.connections.Connections`), or
    closed by the worker, so the TIME_WAIT is left on the worker's ephemeral port rather
    than on the engine's port, which the port picker tests."""
    if chunk.endswith(_DONE_EVENT):
        return True
    return len(chunk) < len(_DONE_EVENT) and (previous[-len(_DONE_EVENT) :] + chunk).endswith(
        _DONE_EVENT
    )


def malformation(events: bytes) -> str | None:
    """What is wrong with these SSE events, or None."""
    for line in events.split(b"\n"):
        line = line.rstrip(b"\r")
        if not line:
            continue
        if not line.startswith(_SSE_FIELDS):
            return "bytes that are not server-sent events"
        if line.startswith(b"data:"):
            payload = line[5:].strip()
            if payload != b"[DONE]" and not (
                payload[:1] in (b"{", b"[") and payload[-1:] in (b"}", b"]")
            ):
                return "an event whose data is not JSON"
    return None


def _one_json_event(events: bytes) -> bool:
    """The usual case, checked cheaply: one ``data: {...}`` event and nothing else."""
    return (
        events.startswith(b"data: {")
        and events.endswith(b"}\n\n")
        and events.count(b"\n") == 2
        and b"\r" not in events
    )


def _has_oversized_event(buffer: bytes) -> bool:
    """Whether any event in ``buffer`` (the unfinished last one included) is over 8 MiB."""
    return any(len(event) > MAX_EVENT_BYTES for event in buffer.split(b"\n\n"))
