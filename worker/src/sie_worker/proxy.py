"""Relay an OpenAI-style request to a model's engine and its answer back to the client.

Upstream failures are translated in one place (:func:`_translate`): no bytes within the
read cap become ``engine_timeout`` (504; the engine is not restarted), a refused or broken
connection becomes ``engine_unavailable`` (502). Once a stream has started, failures end it
with one SSE error event instead, at an event boundary.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field

import httpx
from starlette.background import BackgroundTask
from starlette.responses import Response, StreamingResponse

from sie_worker.errors import (
    EngineTimeout,
    EngineUnavailable,
    InvalidRequest,
    PayloadTooLarge,
    SieError,
)

__all__ = ["Lease", "forward", "sse_error_event"]

_log = logging.getLogger("sie_worker.proxy")
_FORWARDED_HEADERS = ("content-type", "accept", "x-request-id")
_SSE_FIELDS = (b"data:", b"event:", b"id:", b"retry:", b":")
_MAX_SSE_EVENT_BYTES = 8 * 1024 * 1024
_CONNECT_TIMEOUT_S = 5.0
_WRITE_TIMEOUT_S = 60.0


@dataclass
class Lease:
    """A claim on a ready engine for one request; :meth:`release` ends it (idempotent)."""

    model: str
    base_url: str
    read_timeout_s: float | None
    on_release: Callable[[], None] = field(repr=False)
    status: str = "error"  # the HTTP status the client got, for metrics
    _released: bool = field(default=False, repr=False)

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.on_release()


async def forward(
    client: httpx.AsyncClient,
    lease: Lease,
    path: str,
    body: bytes,
    headers: Mapping[str, str],
    *,
    stream: bool,
    request_id: str,
) -> Response:
    """Send ``body`` to the engine's ``path``; the lease is released when the answer is done."""
    upstream_headers = {k: v for k, v in headers.items() if k.lower() in _FORWARDED_HEADERS}
    upstream_headers["x-request-id"] = request_id
    timeout = httpx.Timeout(
        connect=_CONNECT_TIMEOUT_S,
        read=lease.read_timeout_s,
        write=_WRITE_TIMEOUT_S,
        pool=None,
    )
    request = client.build_request(
        "POST", lease.base_url + path, content=body, headers=upstream_headers, timeout=timeout
    )
    try:
        with _translate(lease):
            upstream = await client.send(request, stream=True)
    except SieError as error:
        lease.status = str(error.status)
        lease.release()
        raise
    except BaseException:
        lease.release()
        raise
    reply_headers = {"x-request-id": request_id}
    if not stream or upstream.status_code != 200:
        try:
            with _translate(lease):
                content = await upstream.aread()
            response = _json_reply(lease, upstream.status_code, content, reply_headers)
            lease.status = str(response.status_code)
            return response
        except SieError as error:
            lease.status = str(error.status)
            raise
        finally:
            await upstream.aclose()
            lease.release()
    lease.status = "200"
    reply_headers.update({"cache-control": "no-cache", "x-accel-buffering": "no"})
    return StreamingResponse(
        _relay_events(upstream, lease),
        media_type="text/event-stream",
        headers=reply_headers,
        background=BackgroundTask(_close, upstream, lease),
    )


def sse_error_event(error: SieError) -> bytes:
    return b"data: " + json.dumps(error.body()).encode() + b"\n\n"


@contextlib.contextmanager
def _translate(lease: Lease) -> Iterator[None]:
    try:
        yield
    except httpx.ReadTimeout as exc:
        raise EngineTimeout(
            f"{lease.model}: engine sent nothing for request_read_timeout_s="
            f"{lease.read_timeout_s:g}s; the request was failed, the engine keeps running"
        ) from exc
    except httpx.TimeoutException as exc:
        raise EngineUnavailable(f"{lease.model}: engine did not accept the request: {exc}") from exc
    except httpx.HTTPError as exc:
        raise EngineUnavailable(
            f"{lease.model}: engine connection failed: {type(exc).__name__}: {exc}"
        ) from exc


def _json_reply(lease: Lease, status: int, content: bytes, headers: dict[str, str]) -> Response:
    if status >= 400:
        raise _engine_error(lease, status, content)
    try:
        json.loads(content)
    except ValueError as exc:
        raise EngineUnavailable(
            f"{lease.model}: engine answered {status} with a body that is not JSON"
        ) from exc
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


async def _relay_events(upstream: httpx.Response, lease: Lease) -> AsyncIterator[bytes]:
    """Yield whole SSE events as they arrive; end with an error event if the engine fails."""
    pending = b""
    try:
        with _translate(lease):
            async for chunk in upstream.aiter_raw():
                pending += chunk
                cut = pending.rfind(b"\n\n")
                if cut < 0:
                    if len(pending) > _MAX_SSE_EVENT_BYTES:
                        yield _malformed(lease, "an event larger than 8 MiB")
                        return
                    continue
                events, pending = pending[: cut + 2], pending[cut + 2 :]
                if not _well_formed(events):
                    yield _malformed(lease, "bytes that are not server-sent events")
                    return
                yield events
        if pending.strip():
            yield _malformed(lease, "a truncated event")
    except SieError as error:
        _log.warning("stream from %s ended: %s", lease.model, error.message)
        yield (b"\n\n" if pending else b"") + sse_error_event(error)


def _well_formed(events: bytes) -> bool:
    for line in events.split(b"\n"):
        line = line.rstrip(b"\r")
        if line and not line.startswith(_SSE_FIELDS):
            return False
    return True


def _malformed(lease: Lease, what: str) -> bytes:
    error = EngineUnavailable(f"{lease.model}: engine sent {what}; stream closed")
    _log.warning("%s", error.message)
    return sse_error_event(error)


async def _close(upstream: httpx.Response, lease: Lease) -> None:
    try:
        await upstream.aclose()
    finally:
        lease.release()
