"""Every server's front door (worker, router, gateway): the app class that does, for each
request and before Starlette routes it, what every route needs done first.

* The wire: uvicorn's cycle is kept in the scope for
  :func:`~sie_worker.http.wire.wire_for`, as :class:`~sie_worker.http.wire.WiredStarlette`
  does (it has to be seen before Starlette's own middleware wraps ``send``); the app
  refuses a middleware that may rewrite bodies, as that class does.
* ``X-Request-Id`` on every request and every answer: a request without one gets a fresh
  id (32 hex digits) before any route runs, written into its headers, so every hop behind
  this one (slot router, worker, engine) sees the same id; the answer carries it back,
  errors included, also as ``X-SIE-Request-ID`` (where sie-sdk reads a request's id).
* Request limits (``max_bytes``): a head above 64 KiB (request line and headers, as the
  upstream client refuses an answer's) gets 431, a body above ``SIE_MAX_BODY_BYTES`` 413,
  whether or not Content-Length is sent. A client that leaves before its whole body
  arrived ends the request quietly: there is no one to answer, and it is not the server's
  error.
* Bearer-token auth (``api_key``, ``SIE_API_KEY``) on every path but the probes and
  metrics.
* A request still unanswered when the server's drain ends (``SIE_DRAIN_TIMEOUT_S``: uvicorn
  then cancels it) gets a JSON ``engine_unavailable`` error, not uvicorn's plain-text 500;
  one whose answer has begun is cut, as there is no way to say more.

One frame, not five: a request's task resumes through every frame it is awaited in, so
each middleware layer (and the app class) was entered again at every write of a streamed
answer (``docs/architecture.md``, counting the files on the path).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.types import Message, Receive, Scope, Send

from sie_worker.errors import EngineUnavailable, HeadersTooLarge, PayloadTooLarge, Unauthorized
from sie_worker.http.errors import EXCEPTION_HANDLERS, send_error
from sie_worker.http.headers import MAX_HEAD_BYTES
from sie_worker.http.wire import CYCLE, CYCLE_KEY, WiredStarlette

__all__ = [
    "OPEN_PATHS",
    "REQUEST_ID_HEADER",
    "FrontDoor",
    "head_bytes",
]

OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
REQUEST_ID_HEADER = "x-request-id"
_ID = REQUEST_ID_HEADER.encode()
_SIE_ID = b"x-sie-request-id"
_SCHEME = len(b"bearer ")
_log = logging.getLogger("sie_worker.middleware")


def _too_large(limit: int) -> PayloadTooLarge:
    # Made only when needed: every request passes here.
    return PayloadTooLarge(
        f"request body is larger than {limit} bytes (SIE_MAX_BODY_BYTES); send a smaller one"
    )


async def _client_left(request: Request, exc: Exception) -> Response:
    """A client that left before its whole body arrived: no one to answer, no error."""
    _log.info("%s %s: the client left before sending its body", request.method, request.url.path)
    return Response(status_code=400)


_STOPPED = EngineUnavailable(
    "the server stopped before this request was answered: what it waited on did not answer "
    "within the drain timeout (SIE_DRAIN_TIMEOUT_S); send it again"
)


def head_bytes(scope: Scope) -> int:
    """The size of a request's head as it came: request line, headers and their framing."""
    line = len(scope["method"]) + len(scope.get("raw_path") or b"") + len(scope["query_string"])
    return line + 12 + sum(len(k) + len(v) + 4 for k, v in scope["headers"])


class _CountedBody:
    """The request's ``receive``, refusing a body once it grows past the limit."""

    __slots__ = ("limit", "receive", "received")

    def __init__(self, receive: Receive, limit: int) -> None:
        self.receive = receive
        self.limit = limit
        self.received = 0

    async def __call__(self) -> Message:
        message = await self.receive()
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            if self.received > self.limit:
                raise _too_large(self.limit)  # answered by the app's error rendering
        return message


class _IdentifiedAnswer:
    """The request's ``send``: the answer's head gets the request id."""

    __slots__ = ("request_id", "send", "started")

    def __init__(self, send: Send, request_id: bytes) -> None:
        self.send = send
        self.request_id = request_id
        self.started = False

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
            answer: list[tuple[bytes, bytes]] = list(message.get("headers", []))
            names = {k.lower() for k, _ in answer}
            added = [(k, self.request_id) for k in (_ID, _SIE_ID) if k not in names]
            if added:
                message = {**message, "headers": [*answer, *added]}
        await self.send(message)


class FrontDoor(WiredStarlette):
    """A Starlette app behind its front door: the wire's cycle recorded (as
    :class:`~sie_worker.http.wire.WiredStarlette` does, whose middleware rule it keeps),
    then the request id, the request limits (with ``max_bytes``) and bearer auth (with
    ``api_key``), in this one frame."""

    def __init__(
        self,
        routes: Sequence[BaseRoute] | None = None,
        *,
        middleware: Sequence[Middleware] | None = None,
        exception_handlers: Mapping[Any, Callable[..., Any]] | None = None,
        lifespan: Callable[[Any], AbstractAsyncContextManager[None]] | None = None,
        max_bytes: int | None = None,
        api_key: str | None = None,
    ) -> None:
        super().__init__(
            routes=routes,
            middleware=middleware,
            exception_handlers={
                **EXCEPTION_HANDLERS,
                ClientDisconnect: _client_left,
                **(exception_handlers or {}),
            },
            lifespan=lifespan,
        )
        self.max_bytes = max_bytes
        self._expected = f"bearer {api_key}".encode() if api_key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await Starlette.__call__(self, scope, receive, send)
            return
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        request_id = None
        supplied = b""
        declared = 0
        for name, value in headers:
            if name == _ID and value and request_id is None:
                request_id = value
            elif name == b"authorization" and not supplied:
                supplied = value
            elif name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
        if request_id is None:
            request_id = uuid.uuid4().hex.encode()
            scope = {**scope, "headers": [*headers, (_ID, request_id)]}
        answer = _IdentifiedAnswer(send, request_id)
        limit = self.max_bytes
        if limit is not None:
            refusal = self._refusal(scope, supplied, declared, limit)
            if refusal is not None:
                await send_error(answer, refusal)
                return
            receive = _CountedBody(receive, limit)
        elif not self._authorized(scope, supplied):
            await send_error(answer, Unauthorized())
            return
        cycle = getattr(send, "__self__", None)
        wired = CYCLE is not None and type(cycle) is CYCLE
        if wired:
            scope[CYCLE_KEY] = cycle
        try:
            # Starlette's own call, not WiredStarlette's: this frame records the cycle.
            await Starlette.__call__(self, scope, receive, answer)
        except asyncio.CancelledError:
            # why: uvicorn cancels what still runs when its drain ends; its own answer would be
            # a plain-text 500. A head already out (the wire writes it past ``answer``) cannot
            # be taken back.
            task = asyncio.current_task()
            if task is None or answer.started or getattr(cycle, "response_started", False):
                raise
            await send_error(answer, _STOPPED)
            task.uncancel()
        finally:
            if wired:
                # The cycle holds the scope: leave no reference loop for the collector.
                del scope[CYCLE_KEY]

    def _refusal(
        self, scope: Scope, supplied: bytes, declared: int, limit: int
    ) -> HeadersTooLarge | Unauthorized | PayloadTooLarge | None:
        """Why the request is refused before any route runs, in this order; None: it is not."""
        if head_bytes(scope) > MAX_HEAD_BYTES:
            return HeadersTooLarge(
                "the request's line and headers are larger than 64 KiB; send less in "
                "headers (large values belong in the body)"
            )
        if not self._authorized(scope, supplied):
            return Unauthorized()
        if declared > limit:
            return _too_large(limit)
        return None

    def _authorized(self, scope: Scope, supplied: bytes) -> bool:
        if self._expected is None or scope["path"] in OPEN_PATHS:
            return True
        # The scheme is case-insensitive (RFC 7235: "bearer" is "Bearer"); the token is not.
        supplied = supplied[:_SCHEME].lower() + supplied[_SCHEME:]
        # Constant-time: the comparison does not reveal how much of the key matched.
        return hmac.compare_digest(supplied, self._expected)
