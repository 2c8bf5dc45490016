"""The client's connection, written to straight from the upstream parser's callback.

A streamed answer that goes through ASGI costs one ``send`` message per write: a task
switch, the middleware's wrappers and uvicorn's ``RequestResponseCycle.send`` for every
event (the top of the relay's profile, ``docs/benchmarks.md``, Gateway), and a large
answer with a length comes in as many reads, each of which would cost the same (a 1.1 MB
embedding: some 20, about 2 ms of a hop's CPU; "One hop, parsed once"). Once the answer's
head has gone out through ``send`` (so middleware still sees and extends it), with chunked
framing or a ``Content-Length``, its body can leave as it is read, written to the client's
transport directly (as chunks, or as they are within the length), and the end through
``send`` again, where uvicorn finishes the exchange (keep-alive, pipelining) and checks
that the length was met.

This relies on uvicorn's httptools protocol (``uvicorn.protocols.http.httptools_impl``):
the ASGI ``send`` it passes is the bound method of a ``RequestResponseCycle`` whose
``transport`` is the client's socket, whose ``flow`` pauses writes past the transport's
high-water mark, and which records ``disconnected``, the answer's ``chunked_encoding`` and
what is left of its ``expected_content_length`` (which the wire counts down as uvicorn would).
:data:`VERIFIED_UVICORN` is the release those internals were checked against; the locks pin
it and ``worker/tests/http/test_wire.py`` fails when either changes. Anything else (another
server or protocol, ``httpx.ASGITransport`` in tests, HEAD, HTTP/1.0, an empty body)
gets no wire, and the caller relays through ``send`` as before.

:class:`WiredStarlette` is the app class that records the cycle: it has to be seen before
Starlette's own middleware wraps ``send``. Since the body bypasses every middleware's
``send``, a middleware that rewrites bodies (compression, say) would corrupt answers
silently: the app refuses to start with any middleware that does not declare
``passes_body_through = True`` (:class:`BodyRewritingMiddleware`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = [
    "VERIFIED_UVICORN",
    "BodyRewritingMiddleware",
    "Wire",
    "WiredStarlette",
    "cycle_class",
    "wire_for",
]

VERIFIED_UVICORN = "0.54.0"
_SCOPE_KEY = "sie_worker.wire"  # the cycle, kept in the scope for the response to find


def cycle_class() -> type[Any] | None:
    """uvicorn's httptools ``RequestResponseCycle`` when it has what :class:`Wire` uses."""
    try:
        from uvicorn.protocols.http.httptools_impl import RequestResponseCycle
    except ImportError:  # no httptools: uvicorn serves with h11, and there is no wire
        return None
    return RequestResponseCycle


_CYCLE = cycle_class()
# What the app class keeps in the scope, and the cycle's class, for the app class every
# server uses (sie_worker.http.front_door.FrontDoor), which records the cycle itself.
CYCLE_KEY = _SCOPE_KEY
CYCLE = _CYCLE


class BodyRewritingMiddleware(TypeError):
    """A middleware of a :class:`WiredStarlette` app does not declare that it passes
    answers' bodies through unchanged."""


class WiredStarlette(Starlette):
    """A Starlette app that keeps uvicorn's cycle in the scope for :func:`wire_for`, whose
    middleware all pass bodies through (streamed bodies go around their ``send``)."""

    def build_middleware_stack(self) -> ASGIApp:
        for middleware in self.user_middleware:
            cls = middleware.cls
            if getattr(cls, "passes_body_through", False) is not True:
                name = getattr(cls, "__qualname__", repr(cls))
                raise BodyRewritingMiddleware(
                    f"{name} may rewrite answers' bodies, and streamed bodies are written "
                    "around middleware (sie_worker.http.wire): remove it, or give it "
                    "`passes_body_through = True` if it never changes a body"
                )
        return super().build_middleware_stack()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or type(getattr(send, "__self__", None)) is not _CYCLE:
            await super().__call__(scope, receive, send)
            return
        scope[_SCOPE_KEY] = send.__self__  # type: ignore[attr-defined]
        try:
            await super().__call__(scope, receive, send)
        finally:
            # The cycle holds the scope: leave no reference loop for the collector to find.
            del scope[_SCOPE_KEY]


class Wire:
    """The client's transport for one answer whose head has gone out, chunked or with a
    length.

    :meth:`write` writes ``data`` (framed as one chunk, or as it is, counted against the
    length; bytes past the length are never written, and uvicorn's end of the answer fails
    on them as it would on its own path); it answers whether the client is behind
    (uvicorn's flow control paused writing: the transport holds more than its high-water
    mark), in which case the caller stops reading upstream and waits for :meth:`drain`.
    Bytes for a client that has gone are dropped.
    """

    __slots__ = ("_cycle", "_flow", "_transport", "chunked", "write")

    def __init__(self, cycle: Any) -> None:
        self._cycle = cycle
        self._transport: asyncio.Transport = cycle.transport
        self._flow = cycle.flow
        self.chunked = bool(cycle.chunked_encoding)
        self.write: Callable[[bytes], bool] = (
            self._chunk if cycle.chunked_encoding else self._counted
        )

    def _chunk(self, data: bytes) -> bool:
        if self._transport.is_closing():
            return True
        self._transport.write(b"%x\r\n%b\r\n" % (len(data), data))
        return bool(self._flow.write_paused)

    def _counted(self, data: bytes) -> bool:
        if self._transport.is_closing():
            return True
        cycle = self._cycle
        left = cycle.expected_content_length
        if len(data) > left:
            data = data[:left]
        cycle.expected_content_length = left - len(data)
        self._transport.write(data)
        return bool(self._flow.write_paused)

    @property
    def left(self) -> int:
        """Body bytes the client was promised and has not been written (a length's)."""
        return int(self._cycle.expected_content_length)

    def count(self, n: int) -> None:
        """``n`` bytes of a body with a length were written around the transport."""
        self._cycle.expected_content_length -= n

    def abandon(self) -> None:
        """The client left mid-body: close its connection, and owe it no more bytes (so that
        the answer's end, through ``send``, finds nothing missing)."""
        self._cycle.expected_content_length = 0
        self._transport.abort()

    @property
    def transport(self) -> asyncio.Transport:
        return self._transport

    async def empty(self) -> None:
        """Return once the transport holds nothing unsent (or the client has gone): its
        flow control pauses, for the while, at any byte held, and resumes at none."""
        transport = self._transport
        if not transport.get_write_buffer_size() or self.gone:
            return
        low, high = transport.get_write_buffer_limits()
        transport.set_write_buffer_limits(high=0, low=0)
        try:
            await self.drain()
        finally:
            if not transport.is_closing():
                transport.set_write_buffer_limits(high=high, low=low)

    @property
    def gone(self) -> bool:
        return bool(self._cycle.disconnected) or self._transport.is_closing()

    @property
    def buffered(self) -> int:
        """Bytes written and not yet taken by the client's socket."""
        return int(self._transport.get_write_buffer_size())

    async def drain(self) -> None:
        """Return once the client has taken enough to write again (or has gone)."""
        if self._flow.write_paused and not self._cycle.disconnected:
            await self._flow.drain()


def wire_for(scope: Scope) -> Wire | None:
    """The wire of an answer whose head was just sent, when its body may be written to the
    client directly: uvicorn's httptools cycle, HTTP/1.1, not HEAD, chunked framing or a
    length with bytes still to come."""
    cycle = scope.get(_SCOPE_KEY)
    if cycle is None or scope.get("http_version") != "1.1" or scope.get("method") == "HEAD":
        return None
    if not cycle.response_started or cycle.response_complete or cycle.disconnected:
        return None
    if cycle.chunked_encoding is None:
        return None
    if cycle.chunked_encoding is False and cycle.expected_content_length <= 0:
        return None
    return Wire(cycle)
