"""Every server's request limits, one middleware for worker, router and gateway: request
heads above 64 KiB (request line and headers, as the upstream client refuses an answer's)
get 431, bodies above ``SIE_MAX_BODY_BYTES`` 413, whether or not Content-Length is sent.

A client that leaves before its whole body arrived ends the request quietly: there is no
one to answer, and it is not the worker's error (it used to be logged as one, twice).
"""

from __future__ import annotations

import logging

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sie_worker.errors import HeadersTooLarge, PayloadTooLarge
from sie_worker.http.errors import send_error
from sie_worker.http.headers import MAX_HEAD_BYTES

__all__ = ["RequestLimits", "head_bytes"]

_log = logging.getLogger("sie_worker.middleware")


class _TooLarge(Exception):
    pass


def head_bytes(scope: Scope) -> int:
    """The size of a request's head as it came: request line, headers and their framing."""
    line = len(scope["method"]) + len(scope.get("raw_path") or b"") + len(scope["query_string"])
    return line + 12 + sum(len(k) + len(v) + 4 for k, v in scope["headers"])


class RequestLimits:
    passes_body_through = True  # sie_worker.http.wire: it never rewrites an answer's body

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _error(self) -> PayloadTooLarge:
        # Made only when needed: every request passes here.
        return PayloadTooLarge(
            f"request body is larger than {self.max_bytes} bytes (SIE_MAX_BODY_BYTES); send a "
            "smaller one"
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if head_bytes(scope) > MAX_HEAD_BYTES:
            await send_error(
                send,
                HeadersTooLarge(
                    "the request's line and headers are larger than 64 KiB; send less in "
                    "headers (large values belong in the body)"
                ),
            )
            return
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > self.max_bytes:
                    await send_error(send, self._error())
                    return
        received = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise _TooLarge
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except _TooLarge:
            if not started:
                await send_error(send, self._error())
        except ClientDisconnect:
            _log.info(
                "%s %s: the client left before sending its body", scope["method"], scope["path"]
            )
