"""Relay an OpenAI-style request to a model's engine and its answer back to the client.

Upstream failures are translated in one place (:func:`_translate`): no bytes within the
read cap become ``engine_timeout`` (504; the engine is not restarted), a refused or broken
connection becomes ``engine_unavailable`` (502). Once a stream has started, failures end it
with one SSE error event instead, at an event boundary.

Streams are the hot path (``docs/benchmarks.md``): each goes over its own engine connection,
parsed by :mod:`sie_worker.http.stream_client` while the relay writes, so events that arrived
meanwhile leave in one write; the worker closes that connection after ``[DONE]``.

A profile's runtime options (:class:`~sie_worker.config.runtime.RequestRuntime`) rewrite the
body before it is sent and bound the answer: ``first_chunk_timeout_s`` (time to the first
bytes of the answer; of the first event of a stream), ``inter_chunk_timeout_s`` (longest
silence, with the read cap), ``overall_timeout_s`` (the whole answer). Past one, the request
fails with ``engine_timeout`` (504, or an SSE error event once a stream has started) and
the worker closes the engine connection, which makes SGLang abort the request; the engine
keeps running.

A request of SIE's native API passes an ``answer`` (the engine's JSON answer -> the client's
response) or ``events`` (a translator of each batch of events); without them the engine's
answer is relayed as it is.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import httpx
from starlette.background import BackgroundTask
from starlette.responses import Response, StreamingResponse

from sie_worker.config.runtime import RequestRuntime, Timeouts
from sie_worker.errors import (
    EngineTimeout,
    EngineUnavailable,
    InvalidRequest,
    PayloadTooLarge,
    SieError,
)
from sie_worker.http.errors import sse_error_event
from sie_worker.http.stream_client import StreamResponse, open_stream
from sie_worker.sie_api.call import Answer, Events, EventTranslator
from sie_worker.worker.deadlines import DeadlineHit, Deadlines
from sie_worker.worker.records import Lease

__all__ = ["forward"]

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
    Streams go over their own connection (:mod:`sie_worker.http.stream_client`), everything else
    through ``client``'s pool. ``runtime`` is the served model's (body rewrite, timeouts);
    ``answer`` / ``events`` translate the engine's answer."""
    upstream_headers = {k: v for k, v in headers.items() if k.lower() in _FORWARDED_HEADERS}
    upstream_headers["x-request-id"] = request_id
    reply_headers = {"x-request-id": request_id}
    limits = Deadlines(
        lease.read_timeout_s, runtime.timeouts if runtime is not None else Timeouts()
    )
    if runtime is not None:
        body = runtime.rewrite(path, body)
    if stream:
        translate = events(lease.model) if events is not None else None
        return await _forward_stream(
            lease, path, body, upstream_headers, reply_headers, limits, translate
        )
    timeout = httpx.Timeout(
        connect=_CONNECT_TIMEOUT_S,
        read=limits.read_s,
        write=_WRITE_TIMEOUT_S,
        pool=None,
    )
    request = client.build_request(
        "POST", lease.base_url + path, content=body, headers=upstream_headers, timeout=timeout
    )
    try:
        with _failure_status(lease), _translate(lease, limits):
            upstream = await limits.first(client.send(request, stream=True))
            try:
                content = await limits.overall(upstream.aread())
            finally:
                await upstream.aclose()
            return _reply(lease, upstream.status_code, content, reply_headers, answer)
    finally:
        lease.release()


async def _forward_stream(
    lease: Lease,
    path: str,
    body: bytes,
    upstream_headers: dict[str, str],
    reply_headers: dict[str, str],
    limits: Deadlines,
    translate: EventTranslator | None,
) -> Response:
    try:
        with _failure_status(lease), _translate(lease, limits):
            upstream = await limits.overall(
                open_stream(
                    lease.base_url + path,
                    body,
                    upstream_headers.items(),
                    connect_timeout_s=_CONNECT_TIMEOUT_S,
                    read_timeout_s=limits.read_s,
                    high_water=_STREAM_HIGH_WATER,
                    stop_after=_ends_with_done,
                )
            )
    except BaseException:
        lease.release()
        raise
    first = b""
    if upstream.status != 200:
        try:
            with _failure_status(lease), _translate(lease, limits):
                content = await upstream.read_all(_MAX_SSE_EVENT_BYTES)
                return _reply(lease, upstream.status, content, reply_headers)
        finally:
            upstream.close()
            lease.release()
    if limits.timeouts.first_chunk_s is not None:
        # Wait for the first event before answering, so that a silent engine gets a 504.
        try:
            with _failure_status(lease), _translate(lease, limits):
                first = await limits.first(upstream.take())
        except BaseException:
            upstream.close()
            lease.release()
            raise
    lease.status = "200"
    reply_headers.update({"cache-control": "no-cache", "x-accel-buffering": "no"})
    return StreamingResponse(
        _relay_events(upstream, lease, limits, first, translate),
        media_type="text/event-stream",
        headers=reply_headers,
        background=BackgroundTask(_close, upstream, lease),
    )


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
def _translate(lease: Lease, limits: Deadlines) -> Iterator[None]:
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
        raise EngineTimeout(
            f"{lease.model}: engine sent nothing for {limits.read_name}="
            f"{limits.read_s or 0:g}s; the request was failed, the engine keeps running"
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


async def _relay_events(
    upstream: StreamResponse,
    lease: Lease,
    limits: Deadlines | None = None,
    first: bytes = b"",
    translate: EventTranslator | None = None,
) -> AsyncIterator[bytes]:
    """Yield whole SSE events as they arrive (through ``translate`` when given); end with an
    error event if the engine fails. Everything that arrived since the last write leaves in
    one write: a write costs about the same for one event as for a hundred. ``first`` is what
    was read before answering."""
    pending = b""
    limits = limits or Deadlines(lease.read_timeout_s, Timeouts())
    try:
        with _translate(lease, limits):
            while True:
                pending += first or await limits.first(upstream.take())
                first = b""
                # Checked before cutting: one take can hold the end of an oversized event
                # and the start of the next, and the size must not depend on where reads split.
                if len(pending) > _MAX_SSE_EVENT_BYTES and _has_oversized_event(pending):
                    yield _malformed(lease, "an event larger than 8 MiB")
                    return
                cut = pending.rfind(b"\n\n")
                if cut >= 0:
                    events, pending = pending[: cut + 2], pending[cut + 2 :]
                    problem = _malformation(events)
                    if problem is not None:
                        yield _malformed(lease, problem)
                        return
                    if translate is not None:
                        events = translate(events)
                    if events:
                        if lease.timer is not None:  # TTFT, then inter-token latency
                            lease.timer.chunk(time.monotonic())
                        yield events
                if upstream.drained:
                    if upstream.error is not None:
                        raise upstream.error
                    break
        if pending.strip():
            yield _malformed(lease, "a truncated event")
    except SieError as error:
        _log.warning("stream from %s ended: %s", lease.model, error.message)
        yield (b"\n\n" if pending else b"") + sse_error_event(error)


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


def _malformed(lease: Lease, what: str) -> bytes:
    error = EngineUnavailable(f"{lease.model}: engine sent {what}; stream closed")
    _log.warning("%s", error.message)
    return sse_error_event(error)


async def _close(upstream: StreamResponse, lease: Lease) -> None:
    # Runs after the response however it ended (done, failed, client gone).
    try:
        upstream.close()
    finally:
        lease.release()
