"""One request to an upstream (an engine, a worker, a pod): the engine call of every hop's
relay, on a new connection or on an idle one kept alive by :class:`Connections`.

httptools parses the answer's head and body in C (httpx parses a chunked body in Python,
one h11 event per chunk, and an engine sends every server-sent event as its own chunk).
:func:`open_stream` connects, sends the request and returns once the head has arrived;
:class:`StreamResponse` then hands the body over as it is read, either buffered
(:meth:`~StreamResponse.take`; reading pauses past ``high_water`` bytes not yet taken) or
spliced (:meth:`~StreamResponse.splice`: each read's body goes to a sink from the parser's
callback, and reading pauses while the sink's client is behind). The request's deadlines
(:class:`~sie_worker.http.deadlines.Deadlines`) are data: one timer per stream, re-armed from
the last read rather than reset on each one.

Connecting costs each hop more than relaying a short stream's events (``docs/benchmarks.md``,
Data path), so a hop that passes ``connections`` gets back the connection of every answer
that ended as HTTP/1.1 keep-alive framing says (a stream the caller stopped at its last
event is read on to its end first, for a moment). An idle connection is closed by this side
after ``idle_s``, before the upstream's own keep-alive timeout (uvicorn's default, which
SGLang keeps, is 5 s), so the TIME_WAIT stays on the hop's ephemeral port; a request whose
reused connection turns out closed before any byte of the answer is sent once more on a
new one (the upstream closed it idle: nothing was served).

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

__all__ = ["Connections", "StreamResponse", "open_stream"]

_MAX_HEAD_BYTES = 64 * 1024
# A stream the caller stopped at its last event (``stop_after``) is read to the end of its
# body for this long, so its connection can be reused; past it, the connection is closed.
_DRAIN_S = 1.0
_Key = tuple[str, int]


class Connections:
    """Idle keep-alive connections to upstreams, by host and port, for :func:`open_stream`
    to reuse (the most recent first). Each is closed after ``idle_s`` unused, or when the
    upstream closes it; at most ``max_idle`` are kept per upstream. :meth:`close` closes
    every idle one and keeps none from then on (an app's shutdown, an engine's stop)."""

    def __init__(self, *, idle_s: float = 3.0, max_idle: int = 512) -> None:
        self.idle_s = idle_s
        self.max_idle = max_idle
        self.closed = False
        self._idle: dict[_Key, list[_Idle]] = {}

    def idle(self) -> int:
        """How many idle connections are kept now."""
        return sum(len(entries) for entries in self._idle.values())

    def close(self) -> None:
        self.closed = True
        idle, self._idle = self._idle, {}
        for entries in idle.values():
            for entry in entries:
                entry.close()

    def _take(self, key: _Key) -> asyncio.Transport | None:
        entries = self._idle.get(key)
        while entries:
            entry = entries.pop()
            transport = entry.detach()
            if transport is not None:
                return transport
        return None

    def _give_back(self, key: _Key, transport: asyncio.Transport) -> None:
        entries = self._idle.setdefault(key, [])
        if self.closed or len(entries) >= self.max_idle or transport.is_closing():
            transport.close()
            return
        entries.append(_Idle(self, key, transport))

    def _forget(self, entry: _Idle) -> None:
        entries = self._idle.get(entry.key)
        if entries is not None and entry in entries:
            entries.remove(entry)


class _Idle(asyncio.Protocol):
    """The protocol of a connection while it waits in :class:`Connections`: anything the
    upstream sends now (bytes, its close) ends it."""

    def __init__(self, pool: Connections, key: _Key, transport: asyncio.Transport) -> None:
        self.pool, self.key = pool, key
        self._transport: asyncio.Transport | None = transport
        transport.set_protocol(self)
        transport.resume_reading()  # so that the upstream's close is seen while idle
        self._timer = asyncio.get_running_loop().call_later(pool.idle_s, self.close)

    def detach(self) -> asyncio.Transport | None:
        """The connection, for a new request (None: it was closed meanwhile)."""
        self._timer.cancel()
        transport, self._transport = self._transport, None
        if transport is None or transport.is_closing():
            return None
        return transport

    def close(self) -> None:
        self._timer.cancel()
        transport, self._transport = self._transport, None
        self.pool._forget(self)
        if transport is not None:
            transport.close()

    def data_received(self, data: bytes) -> None:
        self.close()  # an idle upstream has nothing to say: the connection is not reusable

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._timer.cancel()
        self.pool._forget(self)


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
        connections: Connections | None = None,
        key: _Key = ("", 0),
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
        self._connections = connections
        self._key = key
        self.reused = False  # sent on a connection an earlier request left idle
        self.closed_silent = False  # the upstream closed before one byte of the answer
        self._complete = False  # the body ended as its framing says (the connection is clean)
        self._keep_alive = False  # the answer lets the connection serve another request
        self._draining: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Not an isinstance check: uvloop's transports do not subclass asyncio's.
        self._transport = cast(asyncio.Transport, transport)
        self._last_read = self._loop.time()
        self._arm()

    def adopt(self, transport: asyncio.Transport) -> None:
        """Take over an idle connection from :class:`Connections`."""
        transport.set_protocol(self)
        self.reused = True
        self.connection_made(transport)

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
        # The last bytes of an answer stay for the caller, who writes them with the end of
        # its own answer (one write, and one wake-up of the next hop, instead of two).
        if sink is not None and self._chunks and not self.finished:
            chunks = self._chunks
            body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            chunks.clear()
            if sink(body) and not self._paused:
                self._paused = True
                transport.pause_reading()
                self._arrived.set()
        if self.finished:
            self._done_reading()
        elif self._size > self._high_water and not self._paused:
            self._paused = True
            transport.pause_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        self._transport = None
        self._stop_draining()
        if self.finished:
            return
        if exc is None and self._head.done() and self._delimited_by_close:
            self._end()  # a body without length or chunking ends with the connection
            return
        detail = f": {exc}" if exc else ""
        if not self._head.done():
            self.closed_silent = not self._head_bytes
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
        self._keep_alive = self._parser.should_keep_alive()
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
        self._complete = True
        self._keep_alive = self._parser.should_keep_alive()  # only known until the next byte
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
        already first), except the bytes read with the body's end: those wait for
        :meth:`rest`. ``sink`` answers True when its client is behind: reading pauses
        until :meth:`resume`, and :meth:`wait` returns."""
        self._sink = sink
        self._size = 0
        if self._chunks and not self.finished:
            body = b"".join(self._chunks)
            self._chunks.clear()
            if sink(body):
                if not self._paused and self._transport is not None:
                    self._paused = True
                    self._transport.pause_reading()
                return
        if self._paused:
            self.resume()

    def rest(self) -> bytes:
        """What is left of a finished answer's body (spliced: the bytes read with its end)."""
        data = b"".join(self._chunks)
        self._chunks.clear()
        return data

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
        """Stop reading; the connection is closed from this side unless it is clean to
        reuse, or being read to its end for that (idempotent)."""
        self._cancel_timer()
        if not self.finished:
            self.finished = True
            self._arrived.set()
        if self._draining is None and self._transport is not None:
            self._close_transport()

    # -- internals -----------------------------------------------------------------------

    def _reusable(self) -> bool:
        return (
            self._connections is not None
            and not self._connections.closed
            and not self._head_only
            and self.error is None
            and self._keep_alive
        )

    def _done_reading(self) -> None:
        """The answer has ended for the caller: give the connection back when its body
        ended cleanly, read on to that end when the caller stopped just before it, else
        close it."""
        transport = self._transport
        if transport is None:
            return
        if not self._reusable():
            self._close_transport()
        elif self._complete:
            self._stop_draining()
            if transport.get_write_buffer_size():
                self._close_transport()  # the request is still being written: not clean
                return
            self._transport = None
            assert self._connections is not None
            self._connections._give_back(self._key, transport)
        elif self._draining is None:
            self._draining = self._loop.call_later(_DRAIN_S, self._close_transport)
            if self._paused:
                self._paused = False
                transport.resume_reading()

    def _stop_draining(self) -> None:
        if self._draining is not None:
            self._draining.cancel()
            self._draining = None

    def _close_transport(self) -> None:
        self._stop_draining()
        transport, self._transport = self._transport, None
        if transport is not None and not transport.is_closing():
            transport.close()

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
        transport, self._transport = self._transport, None
        self._stop_draining()
        if transport is not None:
            transport.abort()

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
    connections: Connections | None = None,
) -> StreamResponse:
    """Send ``method`` with ``body`` to ``url`` (``http://host:port/path?query``) and return
    once the response head has arrived: on an idle connection of ``connections`` when it
    has one to that upstream (and the connection goes back to it once the answer has
    ended), else on a new connection. ``deadlines`` bound the answer (else just
    ``read_timeout_s`` between reads). ``headers`` must not carry Host, Content-Length or
    other hop-by-hop headers: this client writes its own. ``on_connected`` is called once a
    connection is up, just before the request is written: cancelled before that, nothing
    reached the server."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise httpx.UnsupportedProtocol(f"only http:// URLs are streamed, got {url!r}")
    host, port = parts.hostname, parts.port or 80
    if deadlines is None:
        read = Limit("read_timeout_s", read_timeout_s) if read_timeout_s is not None else None
        deadlines = Deadlines(read)
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
    request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "replace") + body
    key = (host, port)

    def protocol() -> StreamResponse:
        return StreamResponse(
            deadlines,
            high_water,
            stop_after,
            head_only=method == "HEAD",
            connections=connections,
            key=key,
        )

    while True:
        idle = connections._take(key) if connections is not None else None
        if idle is not None:
            response = protocol()
            response.adopt(idle)
        else:
            response = await _connect(protocol, host, port, connect_timeout_s)
        if on_connected is not None:
            on_connected()
        response.send(request)
        try:
            await response.wait_head()
        except (httpx.RemoteProtocolError, httpx.ReadError):
            response.close()
            if response.reused and response.closed_silent:
                continue  # closed idle by the upstream before it read the request: again
            raise
        except BaseException:
            response.close()
            raise
        return response


async def _connect(
    protocol: Callable[[], StreamResponse], host: str, port: int, timeout_s: float
) -> StreamResponse:
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout_s):
            _, response = await loop.create_connection(protocol, host, port)
    except TimeoutError:
        raise httpx.ConnectTimeout(f"connecting to {host}:{port} timed out") from None
    except OSError as exc:
        raise httpx.ConnectError(f"cannot connect to {host}:{port}: {exc}") from exc
    return response
