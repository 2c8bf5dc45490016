"""A relayed body with a length, moved from the upstream socket to the client's in the kernel.

Relaying a large answer through Python costs a hop its copies: the event loop's read into a
new bytes object, the parser's copy of the body out of it, and the kernel's copies in and
out (a 1.1 MB embedding: about 1.4 ms of a hop's CPU above a short completion, where the
upstream's head and the client's share of the work cost 0.5 ms; ``docs/benchmarks.md``,
"One hop, parsed once"). ``splice(2)`` moves the bytes from one socket through a pipe to
the other without them entering the process: :func:`splice_rest` does so for the rest of
a body framed by ``Content-Length`` once its head has gone out, on Linux.

The upstream's connection is read around its parser (:meth:`UpstreamAnswer.hand_over`) and
the client's written around uvicorn's transport (:class:`~sie_worker.http.wire.Wire`), each
through its own duplicate of the socket's descriptor, after the transport has sent what it
held. What the hop promised keeps: the read timeout runs while the upstream is awaited (not
while the client is, as when a relay pauses for it), the answer's failure wakes the wait,
a body cut short fails as the parser would fail it (``ReadError``), a client that has gone
ends the upstream request, and a whole body gives its connection back for reuse.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from collections.abc import Callable

import httpx

from sie_worker.http.headers import SPLICE_FROM, body_length
from sie_worker.http.upstream_answer import UpstreamAnswer
from sie_worker.http.wire import Wire

__all__ = ["AVAILABLE", "read_body", "splice_rest"]

AVAILABLE = hasattr(os, "splice") and hasattr(fcntl, "F_SETPIPE_SZ")
_PIPE_BYTES = 1024 * 1024  # Linux's default most for an unprivileged process
_FLAGS = getattr(os, "SPLICE_F_MOVE", 1) | getattr(os, "SPLICE_F_NONBLOCK", 2)
# Empty pipes kept for the next bodies (one per body being relayed at once, up to this).
_PIPES: list[tuple[int, int]] = []
_KEEP_PIPES = 64


async def splice_rest(upstream: UpstreamAnswer, wire: Wire) -> bool | None:
    """Move the rest of ``upstream``'s body to the client of ``wire`` in the kernel. None:
    not done (no length, too little left, or it does not match what the client was
    promised), the caller relays as before; True: the body is whole at the client; False:
    the client went away (the upstream is closed). Raises the upstream's failure."""
    length = body_length(upstream.headers)
    if not AVAILABLE or length is None or length - upstream.body_read < SPLICE_FROM:
        return None
    transport = upstream.hand_over()
    if transport is None:
        return None
    first = upstream.rest()  # read with the head: through the transport, in order
    left = length - upstream.body_read
    matches = wire.left == left + len(first)
    if first:
        wire.write(first)
    if not matches:
        upstream.resume()
        return None
    await wire.empty()
    if wire.gone:
        upstream.close()
        return False
    loop = asyncio.get_running_loop()
    fds: list[int] = []
    pipe: tuple[int, int] | None = None
    try:
        read, write = pipe = _pipe()
        source = _socket_fd(transport)
        fds.append(source)
        sink = _socket_fd(wire.transport)
        fds.append(sink)
        while left:
            try:
                moved = os.splice(source, write, min(left, _PIPE_BYTES), flags=_FLAGS)
            except BlockingIOError:
                upstream.read_around(0)  # the upstream is awaited: the read timeout runs
                await _readable(source, upstream)
                continue
            if moved == 0:
                raise _cut_short()
            left -= moved
            upstream.read_around(moved, complete=not left, client=True)
            while moved:
                try:
                    sent = os.splice(read, sink, moved, flags=_FLAGS)
                except BlockingIOError:
                    await _ready(loop.add_writer, loop.remove_writer, sink, upstream)
                    continue
                except OSError:  # the client reset or closed: nobody to relay to
                    upstream.close()
                    return False
                moved -= sent
                wire.count(sent)
        if len(_PIPES) < _KEEP_PIPES:  # empty: the next body may take it
            _PIPES.append(pipe)
            pipe = None
    except BaseException:
        upstream.close()
        raise
    finally:
        for fd in fds if pipe is None else (*fds, *pipe):
            os.close(fd)
    return True


async def read_body(upstream: UpstreamAnswer, limit: int) -> bytearray | None:
    """The whole body of ``upstream``, read into one buffer of its length around the parser
    (the kernel's copy alone, where the event loop's read, the parser's and a join would
    copy it three times more); called before any of it was taken. None: not done (no
    length, small, or over ``limit``), the caller reads as before. Raises the upstream's
    failure, and ``ReadError`` for a body cut short."""
    length = body_length(upstream.headers)
    if length is None or length > limit or length - upstream.body_read < SPLICE_FROM:
        return None
    transport = upstream.hand_over()
    if transport is None:
        return None
    first = upstream.rest()
    assert len(first) == upstream.body_read, "read_body reads a body none of which was taken"
    upstream.read_around(0)
    buffer = bytearray(length)
    view = memoryview(buffer)
    view[: len(first)] = first
    at = len(first)
    source = -1
    try:
        source = _socket_fd(transport)
        while at < length:
            try:
                got = os.readv(source, [view[at:]])
            except BlockingIOError:
                await _readable(source, upstream)
                continue
            if got == 0:
                raise _cut_short()
            at += got
            upstream.read_around(got, complete=at == length)
    except BaseException:
        upstream.close()
        raise
    finally:
        view.release()
        if source >= 0:
            os.close(source)
    return buffer


def _pipe() -> tuple[int, int]:
    """An empty pipe of 1 MiB: a kept one, else a new one (growing one costs its pages)."""
    if _PIPES:
        return _PIPES.pop()
    read, write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    with contextlib.suppress(OSError):
        fcntl.fcntl(write, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
    return read, write


async def _readable(source: int, upstream: UpstreamAnswer) -> None:
    """Return once ``source`` has bytes; raise the upstream's failure if it failed meanwhile."""
    loop = asyncio.get_running_loop()
    await _ready(loop.add_reader, loop.remove_reader, source, upstream)
    if upstream.error is not None:
        raise upstream.error from None


def _cut_short() -> httpx.ReadError:
    """The failure of a body whose connection closed before its length was met (as the
    parser fails it)."""
    return httpx.ReadError("the engine closed the connection mid-response")


def _socket_fd(transport: asyncio.BaseTransport) -> int:
    """A duplicate of the transport's socket descriptor, to poll and splice apart from it."""
    return os.dup(transport.get_extra_info("socket").fileno())


async def _ready(
    add: Callable[..., object],
    remove: Callable[[int], object],
    fd: int,
    upstream: UpstreamAnswer,
) -> None:
    """Return once ``fd`` is ready, or ``upstream`` has failed (a deadline, say)."""
    waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    upstream.waiter = waiter
    add(fd, _wake, waiter)
    try:
        await waiter
    finally:
        remove(fd)
        upstream.waiter = None


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
