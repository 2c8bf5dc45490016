"""A streamed answer from its upstream socket to the client's socket: every hop's relay.

Every hop (gateway, slot router, worker) relays each streamed event, so this does as little
per event as it can (``docs/benchmarks.md``, Gateway): once the answer's head has gone out,
:func:`relay_body` hands the body to the client's transport (:mod:`sie_worker.http.wire`)
from the upstream parser's callback (no task switch, no ASGI message per event), or, where
there is no wire, through ``send`` with everything that arrived since the last write in one
message. A client that is behind pauses the reading of the upstream socket, which resumes
once the client has drained, so a slow client slows its stream and never grows the hop's
memory. A body transform (the worker's event check) runs on the same bytes on either path.

:func:`relay_stream` is the whole of a stream whose caller makes no routing decisions (the
worker's, to its engine): connect, the head, the first bytes when the caller waits for them,
the client's head, the body, the last bytes, the close; what it means for the caller (an
engine's refusal, a failure's error, the bytes added at the end, what is released) is the
caller's :class:`StreamPolicy`. The slot router and the gateway route and retry first
(:mod:`sie_worker.http.relay`) and use :func:`relay_body` for the body.

:class:`TaskCancel` and :class:`ClientWatch` cancel a relaying task from outside (a backend
leaving rotation, the client leaving) with plain task cancellation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from sie_worker.errors import SieError
from sie_worker.http.connections import Connections
from sie_worker.http.deadlines import Deadlines
from sie_worker.http.upstream import open_stream
from sie_worker.http.upstream_answer import UpstreamAnswer
from sie_worker.http.wire import wire_for
from sie_worker.http.zero_copy import splice_rest

__all__ = [
    "ClientWatch",
    "SplicedResponse",
    "StreamPolicy",
    "TaskCancel",
    "Transform",
    "relay_body",
    "relay_stream",
]

# What the relay does to the body on its way: bytes in, bytes to write out (b"": nothing).
Transform = Callable[[bytes], bytes]


class StreamPolicy(Protocol):
    """What the caller of :func:`relay_stream` decides about one stream."""

    @property
    def headers(self) -> Mapping[str, str]:
        """Added to the client's 200 head (content type included)."""
        ...

    @property
    def wait_first(self) -> bool:
        """Answer the client only once the first body bytes came (a silent upstream then
        fails before any answer)."""
        ...

    def opened(self, status: int, close: Callable[[], None]) -> None:
        """The upstream answered ``status``; ``close`` ends the reading of its body."""
        ...

    def refused(self, status: int, body: bytes) -> Response:
        """The client's answer to an upstream head other than 200 (its whole body read)."""
        ...

    def failure(self, error: Exception, *, answered: bool) -> SieError:
        """``error`` (a transport failure, a deadline) as the client's error; ``answered``:
        the client's head has gone out."""
        ...

    def feed(self, data: bytes) -> bytes:
        """Body bytes on their way: what leaves for the client now."""
        ...

    def end(self, error: SieError | None) -> bytes:
        """The last bytes of the client's body (``error``: why the stream broke off)."""
        ...

    def finished(self) -> None:
        """Called once, however the stream ended (answered, refused, failed, abandoned)."""
        ...


async def relay_stream(
    url: str,
    body: bytes,
    headers: Iterable[tuple[str, str]],
    policy: StreamPolicy,
    *,
    deadlines: Deadlines,
    connect_timeout_s: float,
    high_water: int,
    limit: int,
    stop_after: Callable[[bytes, bytes], bool],
    connections: Connections | None = None,
) -> Response:
    """POST ``body`` to ``url`` (on an idle connection of ``connections`` when there is
    one) and answer the client as ``policy`` says; an answer other than 200 is read whole
    (at most ``limit`` bytes)."""
    return await SplicedResponse(policy).open(
        url,
        body,
        headers,
        deadlines=deadlines,
        connect_timeout_s=connect_timeout_s,
        high_water=high_water,
        limit=limit,
        stop_after=stop_after,
        connections=connections,
    )


class SplicedResponse(Response):
    """The client's side of a :func:`relay_stream`: head, body as it comes, the policy's
    last bytes; the upstream is closed and the policy finished however it ends."""

    def __init__(self, policy: StreamPolicy) -> None:
        # Not Response.__init__: a body would give the answer a Content-Length.
        self.status_code = 200
        self.background = None
        self.init_headers(policy.headers)
        self._policy = policy
        self._upstream: UpstreamAnswer | None = None
        self._first = b""

    async def open(
        self,
        url: str,
        body: bytes,
        headers: Iterable[tuple[str, str]],
        *,
        deadlines: Deadlines,
        connect_timeout_s: float,
        high_water: int,
        limit: int,
        stop_after: Callable[[bytes, bytes], bool],
        connections: Connections | None = None,
    ) -> Response:
        """Send the request and read what the answer needs: this response once the head
        is 200 (and the first bytes came, when the policy waits for them), else the
        policy's answer to the refusal."""
        policy = self._policy
        try:
            try:
                upstream = await open_stream(
                    url,
                    body,
                    headers,
                    connect_timeout_s=connect_timeout_s,
                    deadlines=deadlines,
                    high_water=high_water,
                    stop_after=stop_after,
                    connections=connections,
                )
            except SieError:
                raise
            except Exception as exc:
                raise policy.failure(exc, answered=False) from exc
            policy.opened(upstream.status, upstream.close)
            try:
                if upstream.status != 200:
                    content = await upstream.read_all(limit)
                    upstream.close()
                    answer = policy.refused(upstream.status, content)
                    policy.finished()
                    return answer
                self._first = await upstream.take() if policy.wait_first else b""
                if upstream.error is not None:
                    raise upstream.error
            except SieError:
                upstream.close()
                raise
            except Exception as exc:
                upstream.close()
                raise policy.failure(exc, answered=False) from exc
        except BaseException:
            policy.finished()
            raise
        self._upstream = upstream
        return self

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watch = ClientWatch(receive)
        try:
            await self._relay(scope, send, watch)
        except asyncio.CancelledError:
            if not watch.caught():
                raise
        finally:
            watch.stop()
            if self._upstream is not None:
                self._upstream.close()
            self._policy.finished()

    async def _relay(self, scope: Scope, send: Send, watch: ClientWatch) -> None:
        policy, upstream = self._policy, self._upstream
        assert upstream is not None, "open() comes first"
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        error: SieError | None = None
        rest = b""
        try:
            first = policy.feed(self._first) if self._first else b""
            if first:
                await send({"type": "http.response.body", "body": first, "more_body": True})
            rest = await relay_body(upstream, scope, send, policy.feed)
        except SieError as exc:
            error = exc
        except Exception as exc:
            error = policy.failure(exc, answered=True)
        tail = policy.end(error)
        watch.stop()
        await send({"type": "http.response.body", "body": rest + tail, "more_body": False})


async def relay_body(
    upstream: UpstreamAnswer, scope: Scope, send: Send, transform: Transform | None = None
) -> bytes:
    """Relay the rest of ``upstream``'s body to the client whose answer's head has just
    been sent, through ``transform`` when given, and return once it has ended (raising its
    failure, if any). The end of the answer (a last chunk, ``more_body: False``) is left to
    the caller, who may add an error event first: what this returns (the body's last bytes,
    transformed, where they came with its end) goes first in that last chunk."""
    wire = wire_for(scope)
    if wire is None:
        while not upstream.drained:
            # Everything that arrived since the last write leaves in one write.
            chunk = await upstream.take()
            if transform is not None and chunk:
                chunk = transform(chunk)
            if chunk:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
    else:
        write = wire.write
        if transform is None and not wire.chunked:
            spliced = await splice_rest(upstream, wire)
            if spliced is not None:
                return b""  # whole at the client, or nobody to relay to (upstream closed)
        if transform is None:
            upstream.splice(write)
        else:

            def sink(data: bytes) -> bool:
                out = transform(data)
                return write(out) if out else False

            upstream.splice(sink)
        while not upstream.finished:
            await upstream.wait()
            if wire.gone:
                upstream.close()  # nobody to relay to: the upstream request ends here
                return b""
            if upstream.paused and not upstream.finished:
                await wire.drain()
                upstream.resume()
    if upstream.error is not None:
        raise upstream.error
    rest = upstream.rest()
    return transform(rest) if transform is not None and rest else rest


class TaskCancel:
    """Cancels the task that made it, on a call from anywhere (a callback, another task),
    so that the task can tell this cancellation from any other, as ``asyncio.timeout``
    does: in ``except CancelledError``, :meth:`caught` absorbs it when it was this one's
    alone. (anyio's cancel scopes do the same at several times the cost per request.)"""

    __slots__ = ("_armed", "_task", "fired")

    def __init__(self) -> None:
        task = asyncio.current_task()
        assert task is not None, "TaskCancel needs a running task"
        self._task, self._armed, self.fired = task, True, False

    def __call__(self) -> None:
        if self._armed and not self.fired:
            self.fired = True
            self._task.cancel()

    def caught(self) -> bool:
        """True when the CancelledError being handled is this one's and nothing else's."""
        return self.fired and self._task.uncancel() == 0

    def disarm(self) -> None:
        """Calls from now on do nothing (the guarded part is over)."""
        self._armed = False


class ClientWatch(TaskCancel):
    """Cancels the relaying task when the client goes away (ASGI ``http.disconnect``).
    :meth:`stop` before the answer's last message: once it is complete, uvicorn reports
    every ``receive`` as a disconnect."""

    __slots__ = ("_watcher",)

    def __init__(self, receive: Receive) -> None:
        super().__init__()
        self._watcher = asyncio.get_running_loop().create_task(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self()

    def stop(self) -> None:
        self.disarm()
        self._watcher.cancel()
