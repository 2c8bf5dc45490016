"""The worker's side of a request to its engine: the lease it holds, what is sent, and
what the answer means.

    lease (opened by the route) -> deadlines -> the engine call -> the answer, relayed

A :class:`Lease` is one request's hold on a ready engine (:func:`open_lease`): it counts the
request in flight while it lasts and, when released (once, when the answer is done),
records its status and duration (:func:`record_request`, which also records a request that
failed before it had a lease). This is the only code that counts requests in flight and
records their duration.

Upstream failures are translated in one place (:func:`_failure`): no bytes within the read
cap are ``engine_timeout`` (504; the engine is not restarted), a refused or broken
connection ``engine_unavailable`` (502); a stream that has started ends with one SSE error
event instead, at an event boundary.

Streams are the hot path (``docs/benchmarks.md``): :func:`sie_worker.http.splice.relay_stream`
owns each one from the engine's socket to the client's (on one of the engine's kept-alive
connections, events written from the engine parser's callback, the client answered at
``[DONE]``); this module's
:class:`_EngineStream` says what it means for the worker: the engine's refusals as the
client's errors, the event check (:mod:`sie_worker.worker.events`), the lease given back
once. A JSON answer takes the same client, connections and deadlines, and is read whole.

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
answer is relayed as it is: a JSON answer as bytes, never parsed (only its first and last
bytes are checked, so that a truncated one is a clean 502).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import httpx
from starlette.responses import Response

from sie_worker.config.lora import BASE_ADAPTER
from sie_worker.config.runtime import RequestRuntime, Timeouts
from sie_worker.errors import (
    EngineTimeout,
    EngineUnavailable,
    SieError,
)
from sie_worker.http.connections import Connections
from sie_worker.http.deadlines import DeadlineHit, Deadlines, Limit
from sie_worker.http.splice import relay_stream
from sie_worker.http.transport import MAX_ANSWER_BYTES
from sie_worker.http.upstream import open_stream
from sie_worker.http.zero_copy import read_body
from sie_worker.sie_api.call import Answer, Decode, Events, EventTranslator
from sie_worker.worker.engine_errors import engine_error
from sie_worker.worker.events import MAX_EVENT_BYTES, EventCheck, ends_with_done
from sie_worker.worker.metrics import StreamTimer, WorkerMetrics

if TYPE_CHECKING:
    from sie_worker.worker.launcher.start import RunningEngine
    from sie_worker.worker.records import ModelRecord

__all__ = ["Lease", "forward", "open_lease", "record_request"]

_log = logging.getLogger("sie_worker.proxy")
_T = TypeVar("_T")
_FORWARDED_HEADERS = ("content-type", "accept", "x-request-id")
_STREAM_HIGH_WATER = 1024 * 1024
_CONNECT_TIMEOUT_S = 5.0
_STREAM_HEADERS = {
    "content-type": "text/event-stream; charset=utf-8",
    "cache-control": "no-cache",
    "x-accel-buffering": "no",
}


@dataclass
class Lease:
    """A claim on a ready engine for one request; :meth:`release` ends it (idempotent)."""

    model: str
    base_url: str
    read_timeout_s: float | None
    on_release: Callable[[], None] = field(repr=False)
    status: str = "error"  # the HTTP status the client got, for metrics
    # Makes the timer of a streamed answer's writes (TTFT, inter-token latency) from the
    # model and ``started`` once the stream is open; None: not measured.
    timer: Callable[[str, float], StreamTimer] | None = field(default=None, repr=False)
    started: float = 0.0  # monotonic: when the request arrived
    # The engine's kept-alive connections, for JSON and streams (None: a new one each).
    connections: Connections | None = field(default=None, repr=False)
    _released: bool = field(default=False, repr=False)

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.on_release()


def open_lease(
    record: ModelRecord,
    running: RunningEngine,
    metrics: WorkerMetrics,
    *,
    started: float,
    adapter: str = BASE_ADAPTER,
) -> Lease:
    """Count one request in flight on ``running`` until the lease is released; the release
    records the request's status and its duration since ``started`` (monotonic)."""
    model = record.id
    inflight = metrics.inflight.labels(model=model)
    running.inflight += 1
    running.idle.clear()
    record.touch()
    inflight.inc()

    def release() -> None:
        running.inflight -= 1
        record.touch()
        inflight.dec()
        if running.inflight == 0:
            running.idle.set()
        record_request(metrics, model, lease.status, time.monotonic() - started, adapter=adapter)

    base_url, read_s = running.engine.base_url, running.options.request_read_timeout_s
    lease = Lease(
        model,
        base_url,
        read_s,
        release,
        timer=metrics.stream_timer,
        started=started,
        connections=running.connections,
    )
    return lease


def record_request(
    metrics: WorkerMetrics, model: str, status: str, seconds: float, *, adapter: str
) -> None:
    """One request for ``model`` (``adapter``: its LoRA adapter's label) answered with HTTP
    ``status`` after ``seconds`` (``sie_request_duration_seconds``)."""
    metrics.request_duration.labels(model=model, code=status, adapter=adapter).observe(seconds)


async def forward(
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
    decode: Decode | None = None,
) -> Response:
    """Send ``body`` to the engine's ``path``; the lease is released when the answer is done.
    Streams and JSON answers go over the engine's kept-alive connections (``lease``).
    ``runtime`` is the served model's (body rewrite, timeouts); ``answer`` / ``events``
    translate the engine's answer (``decode`` reads a JSON one for ``answer``)."""
    upstream_headers = {k: v for k, v in headers.items() if k.lower() in _FORWARDED_HEADERS}
    upstream_headers["x-request-id"] = request_id
    deadlines = _deadlines(lease, runtime.timeouts if runtime is not None else Timeouts())
    if runtime is not None:
        body = runtime.rewrite(path, body)
    if not stream:
        reader = (answer, decode or json.loads) if answer is not None else None
        return await _forward_json(lease, path, body, upstream_headers, deadlines, reader)
    translate = events(lease.model) if events is not None else None
    policy = _EngineStream(lease, deadlines, translate, {"x-request-id": request_id})
    return await relay_stream(
        lease.base_url + path,
        body,
        upstream_headers.items(),
        policy,
        deadlines=deadlines,
        connect_timeout_s=_CONNECT_TIMEOUT_S,
        high_water=_STREAM_HIGH_WATER,
        limit=MAX_EVENT_BYTES,
        stop_after=ends_with_done,
        connections=lease.connections,
    )


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


async def _forward_json(
    lease: Lease,
    path: str,
    body: bytes,
    headers: dict[str, str],
    deadlines: Deadlines,
    reader: tuple[Answer, Decode] | None,
) -> Response:
    """A JSON answer, read whole with the same client, connections and deadlines as a
    stream (:func:`~sie_worker.http.upstream.open_stream`)."""
    reply_headers = {"x-request-id": headers["x-request-id"]}
    try:
        try:
            upstream = await open_stream(
                lease.base_url + path,
                body,
                headers.items(),
                connect_timeout_s=_CONNECT_TIMEOUT_S,
                deadlines=deadlines,
                high_water=MAX_ANSWER_BYTES + 1,
                connections=lease.connections,
            )
            try:
                # A large one into one buffer, around the parser (zero_copy).
                content: bytes | bytearray | None = await read_body(upstream, MAX_ANSWER_BYTES)
                if content is None:
                    content = await upstream.read_all(MAX_ANSWER_BYTES + 1)
            finally:
                upstream.close()
            if len(content) > MAX_ANSWER_BYTES:
                raise httpx.RemoteProtocolError(
                    f"the answer is larger than {MAX_ANSWER_BYTES} bytes"
                )
        except Exception as exc:
            raise _failure(lease, deadlines, exc) from exc
        return _reply(lease, upstream.status, content, reply_headers, reader)
    except SieError as error:
        lease.status = str(error.status)
        raise
    finally:
        lease.release()


class _EngineStream:
    """What an engine stream means for the worker (a :class:`~sie_worker.http.splice.
    StreamPolicy`): its refusals and failures as the client's errors, with the status the
    lease records; the event check on its way; the lease given back once at the end."""

    wait_first: bool
    feed: Callable[[bytes], bytes]
    end: Callable[[SieError | None], bytes]

    def __init__(
        self,
        lease: Lease,
        deadlines: Deadlines,
        translate: EventTranslator | None,
        headers: dict[str, str],
    ) -> None:
        self._lease, self._deadlines = lease, deadlines
        self.headers = {**_STREAM_HEADERS, **headers}
        # With first_chunk_timeout_s, the client is answered once the first event came, so
        # that a silent engine gets a 504.
        self.wait_first = deadlines.first_chunk is not None
        self._translate = translate

    def opened(self, status: int, close: Callable[[], None]) -> None:
        # The check (and the stream's timer) start with the engine's answer; feed and end
        # are the check's own methods, so that each read costs one call.
        lease = self._lease
        if status == 200:
            lease.status = "200"  # what the client gets, unless it fails before
        timer = lease.timer(lease.model, lease.started) if lease.timer is not None else None
        check = EventCheck(lease.model, self._translate, timer)
        check.stop = close  # a stream the check refuses is read no further
        self.feed, self.end = check.feed, check.end

    def refused(self, status: int, body: bytes) -> Response:
        headers = {"x-request-id": self.headers["x-request-id"]}
        try:
            return _reply(self._lease, status, body, headers)
        except SieError as error:
            self._lease.status = str(error.status)
            raise

    def failure(self, error: Exception, *, answered: bool) -> SieError:
        translated = _failure(self._lease, self._deadlines, error)
        if not answered:
            self._lease.status = str(translated.status)
        return translated

    def finished(self) -> None:
        self._lease.release()


def _reply(
    lease: Lease,
    status: int,
    content: bytes | bytearray,
    headers: dict[str, str],
    reader: tuple[Answer, Decode] | None = None,
) -> Response:
    response = _json_reply(lease, status, content, headers, reader)
    lease.status = str(response.status_code)
    return response


def _failure(lease: Lease, deadlines: Deadlines, exc: Exception) -> SieError:
    """A failure on the way to or from the engine, as the client's error."""
    if isinstance(exc, SieError):
        return exc
    if isinstance(exc, DeadlineHit):
        what = {
            "first_chunk_timeout_s": "sent nothing",
            "inter_chunk_timeout_s": "went silent",
            "overall_timeout_s": "did not finish",
        }[exc.name]
        return EngineTimeout(
            f"{lease.model}: engine {what} within {exc.name}={exc.seconds:g}s; the request "
            "was failed, the engine keeps running"
        )
    if isinstance(exc, httpx.ReadTimeout):
        read = deadlines.read or Limit("request_read_timeout_s", 0)
        return EngineTimeout(
            f"{lease.model}: engine sent nothing for {read.name}={read.seconds:g}s; the "
            "request was failed, the engine keeps running"
        )
    if isinstance(exc, httpx.TimeoutException):
        return EngineUnavailable(f"{lease.model}: engine did not accept the request: {exc}")
    if not isinstance(exc, httpx.HTTPError):
        # The HTTP stack is not always tidy when a peer vanishes mid-connect (httpcore with
        # anyio can raise AttributeError): still the engine's failure, never a 500.
        _log.warning("%s: engine connection failed: %r", lease.model, exc)
    return EngineUnavailable(
        f"{lease.model}: engine connection failed: {type(exc).__name__}: {exc}"
    )


def _json_reply(
    lease: Lease,
    status: int,
    content: bytes | bytearray,
    headers: dict[str, str],
    reader: tuple[Answer, Decode] | None,
) -> Response:
    if status >= 400:
        raise engine_error(lease.model, status, bytes(content))
    if reader is None:
        # Relayed as bytes, never parsed: only its ends are looked at, so that an answer
        # cut short, or an event stream where a JSON document belongs, is a clean 502.
        if not _framed_as_json(content):
            raise _not_json(lease, status)
        return Response(
            memoryview(content), status_code=status, media_type="application/json", headers=headers
        )
    answer, decode = reader
    try:
        payload: Any = decode(content)
    except ValueError as exc:
        raise _not_json(lease, status) from exc
    response = answer(payload, lease.model)
    response.headers.update(headers)
    return response


def _framed_as_json(content: bytes | bytearray) -> bool:
    """Whether ``content`` begins and ends as a JSON object or array does."""
    first, last = content[:64].lstrip()[:1], content[-64:].rstrip()[-1:]
    return (first, last) in ((b"{", b"}"), (b"[", b"]"))


def _not_json(lease: Lease, status: int) -> EngineUnavailable:
    return EngineUnavailable(
        f"{lease.model}: engine answered {status} with a body that is not JSON"
    )
