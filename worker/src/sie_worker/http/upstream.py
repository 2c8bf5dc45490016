"""One request to an upstream (an engine, a worker, a pod) on its own connection: the
engine call of every hop's relay.

httptools parses the answer's head and body in C (httpx parses a chunked body in Python,
one h11 event per chunk, and an engine sends every server-sent event as its own chunk).
:func:`open_stream` connects, sends the request and returns once the head has arrived;
:class:`StreamResponse` then hands the body over as it is read, either buffered
(:meth:`~StreamResponse.take`; reading pauses past ``high_water`` bytes not yet taken) or
spliced (:meth:`~StreamResponse.splice`: each read's body goes to a sink from the parser's
callback, and reading pauses while the sink's client is behind). The request's deadlines
(:class:`~sie_worker.http.deadlines.Deadlines`) are data: one timer per stream, re-armed from
the last read rather than reset on each one.

Failures are raised as httpx's exception types (``ConnectError``, ``ConnectTimeout``,
``ReadTimeout``, ``ReadError``, ``RemoteProtocolError``) and a passed deadline as
:class:`~sie_worker.http.deadlines.DeadlineHit`, so callers translate every client's
failures in one place.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import cast
from urllib.parse import urlsplit

import httptools
import httpx

from sie_worker.http.deadlines import DeadlineHit, Deadlines, Limit

__all__ = ["StreamResponse", "open_stream"]

_MAX_HEAD_BYTES = 64 * 1024


def _never(chunk: bytes, previous: bytes) -> bool:
    return False


class StreamResponse(asyncio.Protocol):
    """The answer to one request. Buffered, :meth:`take` hands over the body read so far
    and reading pauses past ``high_water`` bytes not yet taken; spliced
    (:meth:`splice`), each read's body goes to a sink at once. Reading stops for good when
    ``stop_after(chunk, previous)`` says the stream is complete."""

    def __init__(
        self,
        deadlines: Deadlines,
        high_water: int,
        stop_after: Callable[[bytes, bytes], bool],
        *,
        head_only: bool = False,
    ) -> None:
        self.status = 0
        self.headers: list[tuple[str, str]] = []
        self.error: Exception | None = None
        self.finished = False
        self._deadlines = deadlines
        self._read_s = deadlines.read_s
        self._high_water = high_water
        self._stop_after = stop_after
        self._head_only = head_only  # the answer to HEAD has no body, whatever it says
        self._parser = httptools.HttpResponseParser(self)
        self._loop = asyncio.get_running_loop()
        self._head: asyncio.Future[None] = self._loop.create_future()
        self._arrived = asyncio.Event()
        self._chunks: list[bytes] = []
        self._size = 0
        self._previous = b""
        self._head_bytes = 0  # received while the head was incomplete
        self._header_bytes = 0  # in header names and values
        self._delimited_by_close = True  # until a content-length or chunked header says no
        self._body_seen = False
        self._paused = False  # reading paused: bytes buffered here, or a client behind
        self._sink: Callable[[bytes], bool] | None = None
        self._last_read = self._loop.time()
        self._timer: asyncio.TimerHandle | None = None
        self._transport: asyncio.Transport | None = None

    # -- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Not an isinstance check: uvloop's transports do not subclass asyncio's.
        self._transport = cast(asyncio.Transport, transport)
        self._last_read = self._loop.time()
        self._arm()

    def data_received(self, data: bytes) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return  # closed from this side: whatever still arrives is not wanted
        self._last_read = self._loop.time()
        try:
            self._parser.feed_data(data)
            if not self._head.done():
                self._head_bytes += len(data)  # all of it: the head is still not complete
                self._check_head_size()
        except httptools.HttpParserError as exc:
            if self._head_bytes > _MAX_HEAD_BYTES:
                self._fail(httpx.RemoteProtocolError("the response head is larger than 64 KiB"))
            else:
                self._fail(httpx.RemoteProtocolError(f"malformed HTTP response: {exc}"))
            return
        sink = self._sink
        if sink is not None and self._chunks:
            chunks = self._chunks
            body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            chunks.clear()
            if sink(body) and not self._paused:
                self._paused = True
                transport.pause_reading()
                self._arrived.set()
        if self.finished:
            self.close()
        elif self._size > self._high_water and not self._paused:
            self._paused = True
            transport.pause_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        if self.finished:
            return
        if exc is None and self._head.done() and self._delimited_by_close:
            self._end()  # a body without length or chunking ends with the connection
            return
        detail = f": {exc}" if exc else ""
        if not self._head.done():
            self._fail(httpx.RemoteProtocolError(f"the engine closed the connection{detail}"))
        else:
            self._fail(httpx.ReadError(f"the engine closed the connection mid-response{detail}"))

    # -- httptools callbacks -------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value)
        self._check_head_size()
        key = name.decode("latin-1").lower()
        if key in ("content-length", "transfer-encoding"):
            self._delimited_by_close = False
        self.headers.append((key, value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        if not self._head.done():
            self._head.set_result(None)
        if self._head_only:
            self._end()

    def on_body(self, body: bytes) -> None:
        if self.finished:
            return
        self._chunks.append(body)
        self._body_seen = True
        if self._sink is None:
            self._size += len(body)
            self._arrived.set()
        if self._stop_after(body, self._previous):
            self._end()
        self._previous = body

    def on_message_complete(self) -> None:
        self._end()

    # -- for the relay -------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        if self._transport is not None:
            self._transport.write(data)

    async def wait_head(self) -> None:
        await asyncio.shield(self._head)

    @property
    def drained(self) -> bool:
        """The response has ended (or failed) and everything read has been taken."""
        return self.finished and not self._chunks

    async def take(self) -> bytes:
        """Everything read since the last call; waits for something unless finished."""
        if not self._chunks and not self.finished:
            self._arrived.clear()
            await self._arrived.wait()
        data = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
        self._chunks.clear()
        self._size = 0
        if self._paused:
            self.resume()
        return data

    def splice(self, sink: Callable[[bytes], bool]) -> None:
        """From now on, hand each read's body to ``sink`` as it is parsed (what was read
        already first). ``sink`` answers True when its client is behind: reading pauses
        until :meth:`resume`, and :meth:`wait` returns."""
        self._sink = sink
        self._size = 0
        if self._chunks:
            body = b"".join(self._chunks)
            self._chunks.clear()
            if sink(body):
                if not self._paused and self._transport is not None:
                    self._paused = True
                    self._transport.pause_reading()
                return
        if self._paused:
            self.resume()

    async def wait(self) -> None:
        """Return when the response has ended (or failed), or reading paused for a client."""
        if not self.finished and not self._paused:
            self._arrived.clear()
            await self._arrived.wait()

    @property
    def paused(self) -> bool:
        return self._paused

    def resume(self) -> None:
        if self._paused and self._transport is not None:
            self._paused = False
            self._last_read = self._loop.time()  # time paused for the client is not idle
            if not self._transport.is_closing():
                self._transport.resume_reading()

    async def read_all(self, limit: int) -> bytes:
        """The rest of the body, at most ``limit`` bytes (more is cut off)."""
        parts: list[bytes] = []
        size = 0
        while not self.drained and size < limit:
            part = await self.take()
            parts.append(part)
            size += len(part)
        if self.error is not None:
            raise self.error
        return b"".join(parts)[:limit]

    def close(self) -> None:
        """Stop reading and close the connection from this side (idempotent)."""
        self._cancel_timer()
        if not self.finished:
            self.finished = True
            self._arrived.set()
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()

    # -- internals -----------------------------------------------------------------------

    def _check_head_size(self) -> None:
        if max(self._head_bytes, self._header_bytes) > _MAX_HEAD_BYTES:
            self._head_bytes = _MAX_HEAD_BYTES + 1
            raise httptools.HttpParserError("the response head is larger than 64 KiB")

    def _end(self) -> None:
        self.finished = True
        self._cancel_timer()
        self._arrived.set()

    def _fail(self, error: Exception) -> None:
        if self.finished:
            return
        self.error = error
        if not self._head.done():
            self._head.set_exception(error)
        self._end()
        if self._transport is not None:
            self._transport.abort()

    def _arm(self) -> None:
        """Set the one timer at the nearest deadline: the read timeout from the last read,
        the first chunk's until a body has come, the whole answer's."""
        due: float | None = None
        if self._read_s is not None:
            due = (self._loop.time() if self._paused else self._last_read) + self._read_s
        fixed = self._deadlines.next_due(self._body_seen) if self._deadlines.fixed else None
        if fixed is not None and (due is None or fixed[0] < due):
            due = fixed[0]
        if due is not None:
            self._timer = self._loop.call_at(due, self._check)

    def _check(self) -> None:
        self._timer = None
        if self.finished:
            return
        now = self._loop.time()
        fixed = self._deadlines.next_due(self._body_seen) if self._deadlines.fixed else None
        if fixed is not None and fixed[0] <= now:
            limit = fixed[1]
            self._fail(DeadlineHit(limit.name, limit.seconds))
            return
        if self._read_s is not None and not self._paused and self._last_read + self._read_s <= now:
            read = self._deadlines.read
            assert read is not None
            self._fail(httpx.ReadTimeout(f"no bytes from upstream for {read.seconds:g}s"))
            return
        self._arm()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


async def open_stream(
    url: str,
    body: bytes,
    headers: Iterable[tuple[str, str]],
    *,
    method: str = "POST",
    connect_timeout_s: float,
    read_timeout_s: float | None = None,
    deadlines: Deadlines | None = None,
    high_water: int,
    stop_after: Callable[[bytes, bytes], bool] = _never,
    on_connected: Callable[[], None] | None = None,
) -> StreamResponse:
    """Send ``method`` with ``body`` to ``url`` (``http://host:port/path?query``) on a new
    connection and return once the response head has arrived. ``deadlines`` bound the
    answer (else just ``read_timeout_s`` between reads). ``headers`` must not carry Host,
    Content-Length or other hop-by-hop headers: this client writes its own.
    ``on_connected`` is called once the connection is up, just before the request is
    written: cancelled before that, nothing reached the server."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise httpx.UnsupportedProtocol(f"only http:// URLs are streamed, got {url!r}")
    host, port = parts.hostname, parts.port or 80
    loop = asyncio.get_running_loop()
    if deadlines is None:
        read = Limit("read_timeout_s", read_timeout_s) if read_timeout_s is not None else None
        deadlines = Deadlines(read)

    def protocol() -> StreamResponse:
        return StreamResponse(deadlines, high_water, stop_after, head_only=method == "HEAD")

    try:
        async with asyncio.timeout(connect_timeout_s):
            _, response = await loop.create_connection(protocol, host, port)
    except TimeoutError:
        raise httpx.ConnectTimeout(f"connecting to {host}:{port} timed out") from None
    except OSError as exc:
        raise httpx.ConnectError(f"cannot connect to {host}:{port}: {exc}") from exc
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    lines = [f"{method} {target} HTTP/1.1", f"Host: {parts.netloc}"]
    for name, value in headers:
        if "\r" in name or "\n" in name or "\r" in value or "\n" in value:
            continue  # never let a header value split the request
        lines.append(f"{name}: {value}")
    if body or method not in ("GET", "HEAD", "DELETE", "OPTIONS"):
        lines.append(f"Content-Length: {len(body)}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "replace")
    if on_connected is not None:
        on_connected()
    response.send(head + body)
    try:
        await response.wait_head()
    except BaseException:
        response.close()
        raise
    return response
