"""A large body with a length, moved around the parser: socket to socket in the kernel at a
relay, into one buffer at the worker.

Relaying a large answer through Python costs a hop its copies: the event loop's read into a
new bytes object, the parser's copy of the body out of it, the kernel's in and out (and at
the worker, which reads an answer whole, a join): for a 1.2 MB embedding about 1.5 ms of a
hop's CPU above a short completion's 0.5-0.6 ms (``docs/benchmarks.md``, "One hop, parsed
once"). :func:`splice_rest` moves the rest of a body framed by ``Content-Length`` from the
upstream's socket to the client's with ``splice(2)`` through a pipe once the client's head
has gone out (Linux), so the bytes never enter the process; :func:`read_body` reads one
into a buffer of its length, for a caller that must see it all before answering.

Reading pauses after the head of such an answer (:class:`UpstreamAnswer`), and the rest is
read around its parser (:meth:`UpstreamAnswer.hand_over`) and written around uvicorn's
transport (:class:`~sie_worker.http.wire.Wire`, once the transport has sent what it held),
each through a duplicate of the socket's descriptor, from the event loop's callbacks on one
descriptor at a time. What the relay promised keeps: the read timeout runs while the
upstream is awaited (not while the client is, as when a relay pauses for it), a deadline or
failure ends the wait, a body cut short fails as the parser would fail it (``ReadError``), a
client that has gone ends the upstream request, and a whole body gives its connection back
for reuse.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os

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
        wire.abandon()
        upstream.close()
        return False
    fds: list[int] = []
    pipe: tuple[int, int] | None = None
    try:
        pipe = _pipe()
        fds += (_socket_fd(transport), _socket_fd(wire.transport))
        whole = await _Splice(upstream, wire, fds[0], fds[1], pipe, left).moved()
        if whole and len(_PIPES) < _KEEP_PIPES:  # empty: the next body may take it
            _PIPES.append(pipe)
            pipe = None
        if not whole:  # the client reset or closed: nobody to relay to
            wire.abandon()
            upstream.close()
        return whole
    except BaseException:
        upstream.close()
        raise
    finally:
        for fd in fds if pipe is None else (*fds, *pipe):
            os.close(fd)


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
    buffer = bytearray(length)
    buffer[: len(first)] = first
    source = -1
    try:
        source = _socket_fd(transport)
        await _Read(upstream, source, buffer, len(first)).moved()
    except BaseException:
        upstream.close()
        raise
    finally:
        if source >= 0:
            os.close(source)
    return buffer


class _Pump:
    """Moves a body around the parser from the event loop's callbacks on one descriptor at
    a time (the upstream's, or the client's while it is behind), with no task switch per
    read; :meth:`moved` returns when it is done, fails, or the upstream fails (a deadline)."""

    def __init__(self, upstream: UpstreamAnswer) -> None:
        self._loop = asyncio.get_running_loop()
        self._upstream = upstream
        self._done: asyncio.Future[bool] = self._loop.create_future()
        self._watching: tuple[int, bool] | None = None  # (fd, for writing)

    async def moved(self) -> bool:
        self._upstream.waiter = self._done  # woken when the upstream fails
        try:
            self._pump()
            whole = await self._done
        finally:
            self._watch(None)
            self._upstream.waiter = None
        if self._upstream.error is not None:
            raise self._upstream.error
        return bool(whole)

    def _pump(self) -> None:
        try:
            self._step()
        except Exception as exc:
            self._finish(exc)

    def _step(self) -> None:  # pragma: no cover - each pump defines it
        raise NotImplementedError

    def _watch(self, fd: int | None, *, writing: bool = False) -> None:
        """Be called back when ``fd`` is ready (None: on nothing)."""
        wanted = None if fd is None else (fd, writing)
        if wanted == self._watching:
            return
        if self._watching is not None:
            old, old_writing = self._watching
            (self._loop.remove_writer if old_writing else self._loop.remove_reader)(old)
        self._watching = wanted
        if fd is not None:
            (self._loop.add_writer if writing else self._loop.add_reader)(fd, self._pump)

    def _finish(self, outcome: bool | Exception) -> None:
        self._watch(None)
        if not self._done.done():
            if isinstance(outcome, Exception):
                self._done.set_exception(outcome)
            else:
                self._done.set_result(outcome)


class _Splice(_Pump):
    def __init__(
        self,
        upstream: UpstreamAnswer,
        wire: Wire,
        source: int,
        sink: int,
        pipe: tuple[int, int],
        left: int,
    ) -> None:
        super().__init__(upstream)
        self._wire, self._source, self._sink = wire, source, sink
        self._read, self._write = pipe
        self._left, self._piped = left, 0

    def _step(self) -> None:
        upstream = self._upstream
        while True:
            if self._piped:
                try:
                    sent = os.splice(self._read, self._sink, self._piped, flags=_FLAGS)
                except BlockingIOError:
                    self._watch(self._sink, writing=True)
                    return
                except OSError:  # the client reset or closed
                    self._finish(False)
                    return
                self._piped -= sent
                self._wire.count(sent)
                continue
            if not self._left:
                self._finish(True)
                return
            try:
                count = min(self._left, _PIPE_BYTES)
                moved = os.splice(self._source, self._write, count, flags=_FLAGS)
            except BlockingIOError:
                upstream.read_around(0)  # the upstream is awaited: the read timeout runs
                self._watch(self._source)
                return
            if moved == 0:
                raise _cut_short()
            self._left -= moved
            self._piped = moved
            upstream.read_around(moved, complete=not self._left, client=True)


class _Read(_Pump):
    def __init__(self, upstream: UpstreamAnswer, source: int, buffer: bytearray, at: int) -> None:
        super().__init__(upstream)
        self._source, self._view, self._at = source, memoryview(buffer), at
        upstream.read_around(0)  # the upstream is awaited: the read timeout runs

    def _step(self) -> None:
        view, length = self._view, len(self._view)
        while self._at < length:
            try:
                got = os.readv(self._source, [view[self._at :]])
            except BlockingIOError:
                self._watch(self._source)
                return
            if got == 0:
                raise _cut_short()
            self._at += got
            self._upstream.read_around(got, complete=self._at == length)
        view.release()
        self._finish(True)


def _pipe() -> tuple[int, int]:
    """An empty pipe of 1 MiB: a kept one, else a new one (growing one costs its pages)."""
    if _PIPES:
        return _PIPES.pop()
    read, write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    with contextlib.suppress(OSError):
        fcntl.fcntl(write, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
    return read, write


def _cut_short() -> httpx.ReadError:
    """The failure of a body whose connection closed before its length was met (as the
    parser fails it)."""
    return httpx.ReadError("the engine closed the connection mid-response")


def _socket_fd(transport: asyncio.BaseTransport) -> int:
    """A duplicate of the transport's socket descriptor, to poll and splice apart from it."""
    return os.dup(transport.get_extra_info("socket").fileno())
