"""Relay one request to a backend a route picks, streaming the answer without buffering.

Shared by the slot router (backends: the pod's workers) and the gateway (backends: pods).
Each try goes out on an idle kept-alive connection to its backend when the hop has one
(:class:`~sie_worker.http.connections.Connections`, in :attr:`RelayLimits.connections`), else
on a new one, which goes back to them once the answer has ended cleanly; the answer's
body goes from that socket to the client's through :func:`sie_worker.http.splice.relay_body`
(written from the upstream parser's callback where the server allows; reading pauses while
the client is behind, so a slow client slows its stream instead of growing memory;
``docs/benchmarks.md``).

The client going away cancels the whole exchange (:class:`~sie_worker.http.splice.
ClientWatch`: the upstream request is closed, so the engine stops working for nobody); the
backend leaving rotation cancels the try alone (a :class:`~sie_worker.http.splice.
TaskCancel` the app calls among those registered in :attr:`Attempt.aborts`). A try that
never reached the backend (its connection was refused, or was still being made when the
backend left rotation) is routed again without that backend; one already written ends
with ``engine_unavailable`` (before the answer's head), an SSE error event (mid stream) or
an aborted connection (mid body).
Backend answers, errors included, pass through unchanged, except that a stream the hop may
resume (:mod:`sie_worker.http.resume`, with ``RelayLimits.resume_max``) goes on on another
backend, routed without holding, when its backend fails after the answer's head.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from sie_worker.errors import EngineUnavailable, SieError
from sie_worker.http.connections import Connections
from sie_worker.http.errors import error_response, sse_error_event
from sie_worker.http.headers import relayed_headers
from sie_worker.http.resume import RESUME_HEADER, Resumer, refusal_reason
from sie_worker.http.splice import ClientWatch, TaskCancel, relay_body
from sie_worker.http.stream_memory import DONE_EVENT as DONE
from sie_worker.http.upstream import Refused, open_stream, translate_errors
from sie_worker.http.upstream_answer import UpstreamAnswer

__all__ = [
    "Attempt",
    "ChooseBackend",
    "Opener",
    "RelayLimits",
    "RelayResponse",
    "Upstream",
]


@dataclass(frozen=True)
class Upstream:
    """What to send to the chosen backend: the client's request, minus hop-by-hop headers."""

    method: str
    target: str  # raw path and query, as the client sent them
    headers: tuple[tuple[str, str], ...]
    body: bytes
    model: str | None  # the model the request is for, when it names one


class Attempt(Protocol):
    """One try of a request on one backend (:class:`sie_worker.backends.table.Attempt`):
    the relay enters it around the try (entering counts the try, leaving accounts for it),
    calls :meth:`answered` with the status the client got from the backend and sets
    ``refused`` when nothing listened."""

    refused: str | None

    @property
    def key(self) -> Hashable:
        """Excluded from the next route call when this try is routed again."""
        ...

    @property
    def name(self) -> str:
        """For messages: ``slot 0``, ``pod sie-l4-default-7f9c``."""
        ...

    @property
    def url(self) -> str:
        """The backend's base URL, ``http://host:port``."""
        ...

    @property
    def aborts(self) -> set[Callable[[], None]]:
        """Where the relay registers what cancels this try."""
        ...

    @property
    def response_headers(self) -> Sequence[tuple[bytes, bytes]]:
        """Added to a relayed answer's head."""
        ...

    @property
    def error_headers(self) -> Sequence[tuple[str, str]]:
        """Added to an error the relay answers itself after this try."""
        ...

    @property
    def resume(self) -> bool:
        """Whether a stream this try relays may be resumed elsewhere (a pool's ``resume``)."""
        ...

    def answered(self, status: int) -> None: ...
    async def __aenter__(self) -> Any: ...
    async def __aexit__(self, kind: Any, error: Any, trace: Any) -> None: ...


# Picks the backend of a try, given the ones already tried (raises a SieError to answer);
# the flag says whether it may hold the request for a backend (False: a resumption, which
# never waits with a broken stream).
ChooseBackend = Callable[[frozenset[Hashable], bool], Awaitable[Attempt]]
Opener = Callable[..., Awaitable[UpstreamAnswer]]


@dataclass(frozen=True)
class RelayLimits:
    connect_timeout_s: float
    read_timeout_s: float | None
    # Unsent bytes held per relayed answer before reading from the backend pauses.
    high_water: int = 1024 * 1024
    # The hop's idle connections to its backends (None: a new connection per try).
    connections: Connections | None = None
    # Resumptions of a broken stream per request (0: none), and what counts each by reason.
    resume_max: int = 0
    on_resume: Callable[[str], None] | None = None


@dataclass
class _Outcome:
    attempt: Attempt | None = None
    started: bool = False
    sse: bool = False
    backend_down: bool = False
    client_gone: bool = False
    error: SieError | None = None
    broken: str | None = None  # why a resumable stream broke off (a resumption's reason)
    ending: bytes = b""  # what ends the client's body if the stream is not resumed
    # A backend's refusal held back to be sent again elsewhere: status, head, body.
    refusal: tuple[int, list[tuple[bytes, bytes]], bytes] | None = None


class RelayResponse(Response):
    """An ASGI response that routes, relays and accounts for one request.

    ``route(exclude, hold)`` picks the backend (raising a :class:`SieError` to answer with
    it); ``on_done(seconds)`` observes the time from arrival to the end; ``opener`` opens the
    backend connection (None: this module's ``open_stream``, looked up at each try so tests
    can replace it).
    """

    def __init__(
        self,
        upstream: Upstream,
        route: ChooseBackend,
        limits: RelayLimits,
        *,
        on_done: Callable[[float], None] | None = None,
        opener: Opener | None = None,
        arrived: float | None = None,
    ) -> None:
        super().__init__(status_code=200)
        self._upstream = upstream
        self._route = route
        self._limits = limits
        self._on_done = on_done
        self._opener = opener
        self._arrived = time.monotonic() if arrived is None else arrived
        within = (limits.read_timeout_s or 3600.0) - (time.monotonic() - self._arrived)
        self._resumer = Resumer.of(upstream, limits.resume_max, within, limits.on_resume)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        outcome = _Outcome()
        watch = ClientWatch(receive)
        try:
            await self._relay(scope, send, outcome)
        except asyncio.CancelledError:
            if not watch.caught():
                raise
            outcome.client_gone = True
        finally:
            watch.stop()
        if self._on_done is not None:
            self._on_done(time.monotonic() - self._arrived)
        if outcome.client_gone:
            return
        attempt = outcome.attempt
        if outcome.backend_down and outcome.error is None and attempt is not None:
            outcome.error = EngineUnavailable(
                f"{attempt.name} stopped answering while serving this request"
            )
        if outcome.refusal is not None and not outcome.started:
            # A backend's refusal that no other backend took over: relayed as it came.
            status, head, body = outcome.refusal
            await send({"type": "http.response.start", "status": status, "headers": head})
            await send({"type": "http.response.body", "body": body, "more_body": False})
            return
        if outcome.broken is not None and outcome.error is None:
            # A resumable stream that was not resumed ends as the backend ended it.
            await send({"type": "http.response.body", "body": outcome.ending, "more_body": False})
            return
        if outcome.error is None:
            return
        if not outcome.started:
            response = error_response(outcome.error)
            if attempt is not None:
                for name, value in attempt.error_headers:
                    response.headers[name] = value
                attempt.answered(response.status_code)
            await response(scope, receive, send)
        elif outcome.sse:
            event = outcome.ending + sse_error_event(outcome.error)
            await send({"type": "http.response.body", "body": event, "more_body": False})
        else:
            # Headers are out and the body is cut short: abort the connection so the client
            # cannot mistake a partial body for a whole one.
            raise outcome.error

    async def _relay(self, scope: Scope, send: Send, outcome: _Outcome) -> None:
        exclude: set[Hashable] = set()
        resumer = self._resumer
        while True:
            try:
                attempt = await self._route(frozenset(exclude), not outcome.started)
            except SieError as exc:
                if not outcome.started:
                    outcome.error = exc
                return  # a resumption found no backend: the stream ends as it broke off
            if resumer is not None:
                resumer.resumed_on(attempt.name)
            async with attempt:
                unreached = await self._attempt(attempt, scope, send, outcome)
            if not unreached:
                if not self._resumed(attempt, outcome):
                    return
                if resumer is not None and resumer.complete:
                    outcome.error, outcome.broken = None, None
                    await send({"type": "http.response.body", "body": DONE, "more_body": False})
                    return
            exclude.add(attempt.key)

    def _resumed(self, attempt: Attempt, outcome: _Outcome) -> bool:
        """Whether the try that just failed goes on on another backend."""
        resumer = self._resumer
        if resumer is None or outcome.client_gone or not attempt.resume:
            return False
        if outcome.backend_down:
            outcome.broken = "backend_down"
        elif isinstance(outcome.error, EngineUnavailable) and outcome.broken is None:
            # Before the head, only a stream may be sent again: the client has nothing yet.
            lost = outcome.started or resumer.streamed()
            outcome.broken = "connection_lost" if lost else None
        return outcome.broken is not None and resumer.again(outcome.broken, attempt.name)

    async def _attempt(self, attempt: Attempt, scope: Scope, send: Send, outcome: _Outcome) -> bool:
        """One try on one backend; True when nothing reached it (route again): it refused
        the connection, or left rotation before the request was written."""
        outcome.attempt = attempt
        # What a try before this one left (a resumption's) is this try's to set again.
        outcome.error, outcome.broken, outcome.backend_down, outcome.ending = None, None, False, b""
        # The backend leaving rotation cancels this try only, so the request can be routed
        # again when it never reached the backend.
        abort = TaskCancel()
        written = False

        def request_written() -> None:
            nonlocal written
            written = True

        attempt.aborts.add(abort)
        response: UpstreamAnswer | None = None
        upstream, limits, resumer = self._upstream, self._limits, self._resumer
        body, headers = upstream.body, upstream.headers
        if resumer is not None and resumer.body is not None:
            body = resumer.body
        if not attempt.resume:
            headers = (*headers, (RESUME_HEADER, "off"))
        try:
            try:
                try:
                    with translate_errors(attempt.name, attempt.url):
                        response = await (self._opener or open_stream)(
                            attempt.url + upstream.target,
                            body,
                            headers,
                            method=upstream.method,
                            connect_timeout_s=limits.connect_timeout_s,
                            read_timeout_s=limits.read_timeout_s,
                            high_water=limits.high_water,
                            on_connected=request_written,
                            connections=limits.connections,
                        )
                except Refused as exc:
                    abort.disarm()
                    attempt.refused = str(exc)
                    return True
                await self._pass_on(response, attempt, scope, send, outcome)
            except asyncio.CancelledError:
                if not abort.caught():
                    raise
                if not written:
                    return True
                outcome.backend_down = True
        except SieError as exc:
            outcome.error = exc
        finally:
            abort.disarm()
            attempt.aborts.discard(abort)
            if response is not None:
                response.close()
        return False

    async def _pass_on(
        self,
        response: UpstreamAnswer,
        attempt: Attempt,
        scope: Scope,
        send: Send,
        outcome: _Outcome,
    ) -> None:
        """Relay the backend's answer, head then body, to the client as it arrives."""
        content_type = next((v for k, v in response.headers if k == "content-type"), "")
        sse = content_type.startswith("text/event-stream")
        resumer = self._resumer if attempt.resume else None
        if resumer is not None and (outcome.started or not (response.status == 200 and sse)):
            reason = refusal_reason(response.status, response.headers)
            if outcome.started or (reason is not None and resumer.streamed()):
                # A continuation's head is not the client's; nor is a refusal to resend.
                attempt.answered(response.status)
                if response.status != 200 or not sse:
                    outcome.broken = reason or "refused"
                    if not outcome.started:  # the client's answer if it is not sent again
                        with translate_errors(attempt.name, attempt.url):
                            body = await response.read_all(self._limits.high_water)
                        outcome.refusal = (response.status, _head(response, attempt), body)
                    raise EngineUnavailable(
                        f"{attempt.name} answered {response.status} "
                        f"({content_type or 'no content type'}) instead of a stream"
                    )
                await self._body(response, attempt, scope, send, outcome, resumer)
                return
            resumer = None
        outcome.sse = sse
        head = _head(response, attempt)
        attempt.answered(response.status)
        await send({"type": "http.response.start", "status": response.status, "headers": head})
        outcome.started = True
        if resumer is not None:
            await self._body(response, attempt, scope, send, outcome, resumer)
            return
        with translate_errors(attempt.name, attempt.url):
            rest = await relay_body(response, scope, send)
        await send({"type": "http.response.body", "body": rest, "more_body": False})

    async def _body(
        self,
        response: UpstreamAnswer,
        attempt: Attempt,
        scope: Scope,
        send: Send,
        outcome: _Outcome,
        resumer: Resumer,
    ) -> None:
        """Relay a resumable stream's body through its memory; a stream that broke off
        leaves the end of the client's body to :meth:`__call__` (or to its resumption)."""
        memory = resumer.memory
        memory.stop = response.close
        with translate_errors(attempt.name, attempt.url):
            rest = await relay_body(response, scope, send, memory.feed)
        if memory.done:
            await send({"type": "http.response.body", "body": rest, "more_body": False})
            return
        if rest:
            await send({"type": "http.response.body", "body": rest, "more_body": True})
        outcome.broken = "error_event" if memory.error is not None else "truncated"
        outcome.ending = memory.withheld or memory.end()


def _head(response: UpstreamAnswer, attempt: Attempt) -> list[tuple[bytes, bytes]]:
    """The head of a backend's answer as the client gets it."""
    relayed = relayed_headers(response.headers)
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in relayed] + [
        *attempt.response_headers
    ]
