"""Refuse request bodies above a size limit with 413, whether or not Content-Length is sent.

A client that leaves before its whole body arrived ends the request quietly: there is no
one to answer, and it is not the worker's error (it used to be logged as one, twice).
"""

from __future__ import annotations

import logging

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sie_worker.errors import PayloadTooLarge
from sie_worker.http.errors import send_error

__all__ = ["BodyLimit"]

_log = logging.getLogger("sie_worker.middleware")


class _TooLarge(Exception):
    pass


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _error(self) -> PayloadTooLarge:
        # Made only when needed: every request passes here.
        return PayloadTooLarge(
            f"request body is larger than {self.max_bytes} bytes (SIE_MAX_BODY_BYTES)"
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
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
