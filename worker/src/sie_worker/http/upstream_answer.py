"""The answer to one request to an upstream, as it is read: :class:`UpstreamAnswer`.

httptools parses the head and body in C (httpx parses a chunked body in Python, one h11
event per chunk, and an engine sends every server-sent event as its own chunk). The body is
handed over as it is read: buffered (:meth:`~UpstreamAnswer.take`; reading pauses past
``high_water`` bytes not yet taken), spliced (:meth:`~UpstreamAnswer.splice`: each read's
body goes to a sink from the parser's callback; reading pauses while the sink's client is
behind), or read around the parser (a large body with a length: :mod:`.zero_copy`; reading
pauses after its head). The deadlines (:class:`~sie_worker.http.deadlines.Deadlines`) are
data: one timer per stream, re-armed from the last read. Interim ``1xx`` answers are read
past. A head over 64 KiB, a malformed head or chunk framing, and a body cut short end the
answer with httpx's ``RemoteProtocolError`` or ``ReadError``. An answer that ended cleanly
as its framing says gives its connection back to :class:`~sie_worker.http.connections.
Connections` (a stream the caller stopped at its last event is read on to its end first,
for a moment); any other is closed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

import httptools
import httpx

from sie_worker.http.connections import Connections, Key
from sie_worker.http.deadlines import Deadlines
from sie_worker.http.headers import MAX_HEAD_BYTES, SPLICE_FROM, body_length

__all__ = ["UpstreamAnswer", "never"]

# A stream the caller stopped at its last event (``stop_after``) is read to the end of its
# body for this long, so its connection can be reused; past it, the connection is closed.
_DRAIN_S = 1.0


def never(chunk: bytes, previous: bytes) -> bool:
    return False


class UpstreamAnswer(asyncio.Protocol):
    """The answer to one request, its body taken, spliced or read around the parser.
    Reading stops for good when ``stop_after(chunk, previous)`` says the stream is complete."""

    def __init__(
        self,
        deadlines: Deadlines,
        high_water: int,
        stop_after: Callable[[bytes, bytes], bool],
        *,
        head_only: bool = False,
        connections: Connections | None = None,
        key: Key = ("", 0),
    ) -> None:
        self.status = 0
        self.headers: list[tuple[str, str]] = []
        self.error: Exception | None = None
        self.finished = False
        self._deadlines = deadlines
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
        self._interim = False  # reading an interim (1xx) answer, which is not the one
        self.body_read = 0  # body bytes read, parsed or spliced (:mod:`.zero_copy`)
        self.waiter: asyncio.Future[Any] | None = None  # set (None) when the answer fails

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
            if self._head_bytes > MAX_HEAD_BYTES:
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
        status = self._parser.get_status_code()
        if 100 <= status < 200 and status != 101:
            # An interim answer (100 Continue, 103 Early Hints): the final one follows.
            self._interim = True
            self.headers.clear()
            self._delimited_by_close = True
            return
        self.status = status
        self._keep_alive = self._parser.should_keep_alive()
        if not self._head.done():
            self._head.set_result(None)
        if self._head_only:
            self._end()
        elif (body_length(self.headers) or 0) >= SPLICE_FROM:
            self.hand_over()  # no reads until the body is taken: it may go around (zero_copy)

    def on_body(self, body: bytes) -> None:
        if self.finished:
            return
        self._chunks.append(body)
        self._body_seen = True
        self.body_read += len(body)
        if self._sink is None:
            self._size += len(body)
            self._arrived.set()
        if self._stop_after(body, self._previous):
            self._end()
        self._previous = body

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False  # the parser reads the next (final) answer from here
            return
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
            self.resume()  # a large body nobody took around the parser: read it here
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

    def hand_over(self) -> asyncio.Transport | None:
        """The connection, reading paused, for the caller to read around the parser."""
        if (transport := self._transport) is None or self.finished or transport.is_closing():
            return None
        if not self._paused:
            self._paused = True
            transport.pause_reading()
        return transport

    def read_around(self, n: int, *, complete: bool = False, client: bool = False) -> None:
        """``n`` body bytes read by the caller (``complete``: all); next it waits for its
        ``client`` (no read timeout, as when paused for one), or for the upstream."""
        self.body_read += n
        self._body_seen = self._body_seen or n > 0
        if n or self._paused:
            self._last_read = self._loop.time()
        self._paused = client
        if complete:
            self._complete = True
            self._end()
            self._done_reading()

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
        """Stop reading; close the connection unless it is clean, or being read to its end."""
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
        """The answer has ended for the caller: give the connection back (the body ended
        cleanly), read on to that end (the caller stopped just before it), or close it."""
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
        if max(self._head_bytes, self._header_bytes) > MAX_HEAD_BYTES:
            self._head_bytes = MAX_HEAD_BYTES + 1
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
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)
        transport, self._transport = self._transport, None
        self._stop_draining()
        if transport is not None:
            transport.abort()

    def _arm(self) -> None:
        """Set the one timer at the nearest deadline (:meth:`Deadlines.due`)."""
        due = self._deadlines.due(self._loop.time(), self._last_read, self._paused, self._body_seen)
        if due is not None:
            self._timer = self._loop.call_at(due, self._check)

    def _check(self) -> None:
        self._timer = None
        if not self.finished:
            now = self._loop.time()
            hit = self._deadlines.passed(now, self._last_read, self._paused, self._body_seen)
            if hit is not None:
                self._fail(hit)
                return
            self._arm()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
