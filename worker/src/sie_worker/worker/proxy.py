"""The worker's relay: an OpenAI-style request to a model's engine, its answer to the client.

    lease (from the route) -> deadlines -> the engine call -> the answer, relayed

Upstream failures are translated in one place (:func:`_translate`): no bytes within the
read cap become ``engine_timeout`` (504; the engine is not restarted), a refused or broken
connection becomes ``engine_unavailable`` (502). Once a stream has started, failures end it
with one SSE error event instead, at an event boundary.

Streams are the hot path (``docs/benchmarks.md``): each goes over its own engine connection
(:mod:`sie_worker.http.splice`), whose events go to the client from the engine parser's
callback, through :class:`_Events` (whole SSE events only, each checked; SIE's translator
when there is one); the worker closes that connection after ``[DONE]``. JSON answers go
through the injected httpx client's pool.

A profile's runtime options (:class:`~sie_worker.config.runtime.RequestRuntime`) rewrite the
body before it is sent and bound the answer (:class:`~sie_worker.http.deadlines.Deadlines`):
``first_chunk_timeout_s`` (time to the first bytes of the answer; of the first event of a
stream), ``inter_chunk_timeout_s`` (longest silence, with the read cap),
``overall_timeout_s`` (the whole answer). Past one, the request fails with
``engine_timeout`` (504, or an SSE error event once a stream has started) and the worker
closes the engine connection, which makes SGLang abort the request; the engine keeps
running.

A request of SIE's native API passes an ``answer`` (the engine's JSON answer -> the client's
response) or ``events`` (a translator of each batch of events); without them the engine's
answer is relayed as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Iterator, Mapping
from typing import Any

import httpx
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from sie_worker.config.runtime import RequestRuntime, Timeouts
from sie_worker.errors import (
    EngineTimeout,
    EngineUnavailable,
    InvalidRequest,
    PayloadTooLarge,
    SieError,
)
from sie_worker.http.deadlines import DeadlineHit, Deadlines, Limit
from sie_worker.http.errors import sse_error_event
from sie_worker.http.splice import ClientWatch, StreamResponse, open_stream, relay_body
from sie_worker.sie_api.call import Answer, Events, EventTranslator
from sie_worker.worker.records import Lease

__all__ = ["Lease", "forward"]

_log = logging.getLogger("sie_worker.proxy")
_FORWARDED_HEADERS = ("content-type", "accept", "x-request-id")
_SSE_FIELDS = (b"data:", b"event:", b"id:", b"retry:", b":")
_MAX_SSE_EVENT_BYTES = 8 * 1024 * 1024
_STREAM_HIGH_WATER = 1024 * 1024
_DONE_EVENT = b"data: [DONE]\n\n"  # the last event of an OpenAI stream
_CONNECT_TIMEOUT_S = 5.0
_WRITE_TIMEOUT_S = 60.0


async def forward(
    client: httpx.AsyncClient,
    lease: Lease,
    path: str,
    body: bytes,
    headers: Mapping[str, str],
    *,
    stream: bool,
    request_id: str,
    runtime: RequestRuntime | None = None,
    answer: Answer | None = None,
    events: Events | None = None,
) -> Response:
    """Send ``body`` to the engine's ``path``; the lease is released when the answer is done.
    Streams go over their own connection, everything else through ``client``'s pool.
    ``runtime`` is the served model's (body rewrite, timeouts); ``answer`` / ``events``
    translate the engine's answer."""
    upstream_headers = {k: v for k, v in headers.items() if k.lower() in _FORWARDED_HEADERS}
    upstream_headers["x-request-id"] = request_id
    reply_headers = {"x-request-id": request_id}
    deadlines = _deadlines(lease, runtime.timeouts if runtime is not None else Timeouts())
    if runtime is not None:
        body = runtime.rewrite(path, body)
    if stream:
        translate = events(lease.model) if events is not None else None
        return await _open_stream(
            lease, path, body, upstream_headers, reply_headers, deadlines, translate
        )
    timeout = httpx.Timeout(
        connect=_CONNECT_TIMEOUT_S, read=deadlines.read_s, write=_WRITE_TIMEOUT_S, pool=None
    )
    request = client.build_request(
        "POST", lease.base_url + path, content=body, headers=upstream_headers, timeout=timeout
    )
    try:
        with _failure_status(lease), _translate(lease, deadlines):
            upstream = await deadlines.first(client.send(request, stream=True))
            try:
                content = await deadlines.overall_step(upstream.aread())
            finally:
                await upstream.aclose()
            return _reply(lease, upstream.status_code, content, reply_headers, answer)
    finally:
        lease.release()


def _deadlines(lease: Lease, timeouts: Timeouts) -> Deadlines:
    """The read cap and the profile's timeouts; the smaller of the cap and
    ``inter_chunk_timeout_s`` is the read timeout between chunks."""
    reads = [
        Limit(name, seconds)
        for seconds, name in (
            (lease.read_timeout_s, "request_read_timeout_s"),
            (timeouts.inter_chunk_s, "inter_chunk_timeout_s"),
        )
        if seconds is not None
    ]
    first, overall = timeouts.first_chunk_s, timeouts.overall_s
    return Deadlines(
        min(reads, key=lambda r: (r.seconds, r.name)) if reads else None,
        first_chunk=Limit("first_chunk_timeout_s", first) if first is not None else None,
        overall=Limit("overall_timeout_s", overall) if overall is not None else None,
    )


async def _open_stream(
    lease: Lease,
    path: str,
    body: bytes,
    upstream_headers: dict[str, str],
    reply_headers: dict[str, str],
    deadlines: Deadlines,
    translate: EventTranslator | None,
) -> Response:
    try:
        with _failure_status(lease), _translate(lease, deadlines):
            upstream = await open_stream(
                lease.base_url + path,
                body,
                upstream_headers.items(),
                connect_timeout_s=_CONNECT_TIMEOUT_S,
                deadlines=deadlines,
                high_water=_STREAM_HIGH_WATER,
                stop_after=_ends_with_done,
            )
    except BaseException:
        lease.release()
        raise
    opened = False
    try:
        with _failure_status(lease), _translate(lease, deadlines):
            if upstream.status != 200:
                content = await upstream.read_all(_MAX_SSE_EVENT_BYTES)
                return _reply(lease, upstream.status, content, reply_headers)
            first = b""
            if deadlines.first_chunk is not None:
                # Wait for the first event before answering, so that a silent engine gets a
                # 504 (the stream's timer fails it at the deadline).
                first = await upstream.take()
                if upstream.error is not None:
                    raise upstream.error
        opened = True
    finally:
        if not opened:
            upstream.close()
            lease.release()
    lease.status = "200"
    reply_headers.update({"cache-control": "no-cache", "x-accel-buffering": "no"})
    events = _Events(upstream, lease, translate)
    return _EventStream(upstream, lease, deadlines, events, first, reply_headers)


class _EventStream(Response):
    """The client's side of a stream: head, events as they come, an error event at the
    end if the engine failed; the engine connection is closed and the lease released
    however it ends (done, failed, client gone)."""

    media_type = "text/event-stream"

    def __init__(
        self,
        upstream: StreamResponse,
        lease: Lease,
        deadlines: Deadlines,
        events: _Events,
        first: bytes,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        # Not Response.__init__: a body would give the answer a Content-Length.
        self.status_code = 200
        self.background = None
        self.init_headers(headers)
        self._upstream, self._lease, self._deadlines = upstream, lease, deadlines
        self._events, self._first = events, first

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watch = ClientWatch(receive)
        try:
            await self._relay(scope, send, watch)
        except asyncio.CancelledError:
            if not watch.caught():
                raise
        finally:
            watch.stop()
            self._upstream.close()
            self._lease.release()

    async def _relay(self, scope: Scope, send: Send, watch: ClientWatch) -> None:
        events = self._events
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        error: SieError | None = None
        try:
            with _translate(self._lease, self._deadlines):
                first = events.feed(self._first) if self._first else b""
                if first:
                    await send({"type": "http.response.body", "body": first, "more_body": True})
                await relay_body(self._upstream, scope, send, events.feed)
        except SieError as exc:
            error = exc
        tail = events.end(error)
        watch.stop()
        await send({"type": "http.response.body", "body": tail, "more_body": False})


class _Events:
    """A stream's bytes on their way to the client: whole SSE events only (an unfinished
    one waits for the rest), each well formed and at most 8 MiB, through SIE's translator
    when there is one. A malformed stream ends with an error event, and its engine
    connection is closed."""

    __slots__ = ("_lease", "_pending", "_translate", "_upstream", "failed")

    def __init__(
        self, upstream: StreamResponse, lease: Lease, translate: EventTranslator | None
    ) -> None:
        self._upstream, self._lease, self._translate = upstream, lease, translate
        self._pending = b""
        self.failed = False

    def feed(self, data: bytes) -> bytes:
        """What of ``data`` (with what was pending) leaves for the client now."""
        if self.failed:
            return b""
        pending = self._pending + data if self._pending else data
        # Checked before cutting: one read can hold the end of an oversized event and the
        # start of the next, and the size must not depend on where reads split.
        if len(pending) > _MAX_SSE_EVENT_BYTES and _has_oversized_event(pending):
            return self._stop("an event larger than 8 MiB")
        cut = pending.rfind(b"\n\n") + 2
        if cut == 1:
            self._pending = pending
            return b""
        if cut == len(pending):
            events, self._pending = pending, b""
        else:
            events, self._pending = pending[:cut], pending[cut:]
        if not _one_json_event(events):
            problem = _malformation(events)
            if problem is not None:
                return self._stop(problem)
        return self._leave(events)

    def _leave(self, events: bytes) -> bytes:
        # Where a stream's events leave for the client (once per write; the first call is
        # its first event): the bytes returned are written at once.
        return events if self._translate is None else self._translate(events)

    def end(self, error: SieError | None) -> bytes:
        """The stream's last bytes: an error event when it failed (``error``) or was cut."""
        if self.failed:
            return b""
        if error is not None:
            _log.warning("stream from %s ended: %s", self._lease.model, error.message)
            return (b"\n\n" if self._pending else b"") + sse_error_event(error)
        if self._pending.strip():
            return self._stop("a truncated event")
        return b""

    def _stop(self, what: str) -> bytes:
        self.failed = True
        self._upstream.close()
        error = EngineUnavailable(f"{self._lease.model}: engine sent {what}; stream closed")
        _log.warning("%s", error.message)
        return sse_error_event(error)


def _reply(
    lease: Lease,
    status: int,
    content: bytes,
    headers: dict[str, str],
    answer: Answer | None = None,
) -> Response:
    response = _json_reply(lease, status, content, headers, answer)
    lease.status = str(response.status_code)
    return response


@contextlib.contextmanager
def _failure_status(lease: Lease) -> Iterator[None]:
    """Record the status of the error a request fails with before its answer started."""
    try:
        yield
    except SieError as error:
        lease.status = str(error.status)
        raise


@contextlib.contextmanager
def _translate(lease: Lease, deadlines: Deadlines) -> Iterator[None]:
    try:
        yield
    except DeadlineHit as exc:
        what = {
            "first_chunk_timeout_s": "sent nothing",
            "inter_chunk_timeout_s": "went silent",
            "overall_timeout_s": "did not finish",
        }[exc.name]
        raise EngineTimeout(
            f"{lease.model}: engine {what} within {exc.name}={exc.seconds:g}s; the request "
            "was failed, the engine keeps running"
        ) from None
    except httpx.ReadTimeout as exc:
        read = deadlines.read or Limit("request_read_timeout_s", 0)
        raise EngineTimeout(
            f"{lease.model}: engine sent nothing for {read.name}={read.seconds:g}s; the "
            "request was failed, the engine keeps running"
        ) from exc
    except httpx.TimeoutException as exc:
        raise EngineUnavailable(f"{lease.model}: engine did not accept the request: {exc}") from exc
    except httpx.HTTPError as exc:
        raise EngineUnavailable(
            f"{lease.model}: engine connection failed: {type(exc).__name__}: {exc}"
        ) from exc
    except SieError:
        raise
    except Exception as exc:
        # The HTTP stack is not always tidy when a peer vanishes mid-connect (httpcore with
        # anyio can raise AttributeError): still the engine's failure, never a 500.
        _log.warning("%s: engine connection failed: %r", lease.model, exc)
        raise EngineUnavailable(
            f"{lease.model}: engine connection failed: {type(exc).__name__}: {exc}"
        ) from exc


def _json_reply(
    lease: Lease,
    status: int,
    content: bytes,
    headers: dict[str, str],
    answer: Answer | None,
) -> Response:
    if status >= 400:
        raise _engine_error(lease, status, content)
    try:
        payload: Any = json.loads(content)
    except ValueError as exc:
        raise EngineUnavailable(
            f"{lease.model}: engine answered {status} with a body that is not JSON"
        ) from exc
    if answer is not None:
        response = answer(payload, lease.model)
        response.headers.update(headers)
        return response
    return Response(content, status_code=status, media_type="application/json", headers=headers)


def _engine_error(lease: Lease, status: int, content: bytes) -> SieError:
    message = _engine_message(content) or f"engine answered HTTP {status}"
    message = f"{lease.model}: {message}"
    if status == 413:
        return PayloadTooLarge(message)
    if 400 <= status < 500:
        return InvalidRequest(message, status=status)  # keep the engine's 4xx (404, 422...)
    return EngineUnavailable(f"{message} (engine HTTP {status})")


def _engine_message(content: bytes) -> str | None:
    try:
        payload = json.loads(content)
    except ValueError:
        text = content[:300].decode("utf-8", "replace").strip()
        return text or None
    if isinstance(payload, dict):
        error = payload.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(error, str):
            return error
        for key in ("message", "detail"):
            if isinstance(payload.get(key), str):
                return str(payload[key])
    return None


def _ends_with_done(chunk: bytes, previous: bytes) -> bool:
    """Whether the stream's ``[DONE]`` event ends with ``chunk``. Reading stops there, before
    the engine's end of body, and the worker closes the connection: a stream's connection is
    never reused, and the TIME_WAIT is left on the worker's ephemeral port rather than on the
    engine's port, which the port picker tests."""
    if chunk.endswith(_DONE_EVENT):
        return True
    return len(chunk) < len(_DONE_EVENT) and (previous[-len(_DONE_EVENT) :] + chunk).endswith(
        _DONE_EVENT
    )


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
    return any(len(event) > _MAX_SSE_EVENT_BYTES for event in buffer.split(b"\n\n"))


def _malformation(events: bytes) -> str | None:
    """What is wrong with these SSE events, or None. A ``data:`` payload must look like one
    JSON document (or ``[DONE]``): a structural check, not a parse, to keep the hot path
    cheap; it catches garbage and truncated documents."""
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
