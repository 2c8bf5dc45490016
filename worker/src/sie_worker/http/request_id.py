"""``X-Request-Id`` on every request and every answer.

A request without one gets a fresh id (32 hex digits) before any route runs, written into
its headers, so every hop behind this one (slot router, worker, engine) sees the same id;
the answer carries it back, errors included, also as ``X-SIE-Request-ID`` (where sie-sdk
reads a request's id).
"""

from __future__ import annotations

import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["REQUEST_ID_HEADER", "RequestId"]

REQUEST_ID_HEADER = "x-request-id"
_HEADER = REQUEST_ID_HEADER.encode()
_SIE_HEADER = b"x-sie-request-id"


class RequestId:
    passes_body_through = True  # sie_worker.http.wire: it never rewrites a body

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        request_id = next((v for k, v in headers if k == _HEADER and v), None)
        if request_id is None:
            request_id = uuid.uuid4().hex.encode()
            scope = {**scope, "headers": [*headers, (_HEADER, request_id)]}

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                answer: list[tuple[bytes, bytes]] = list(message.get("headers", []))
                names = {k.lower() for k, _ in answer}
                added = [(k, request_id) for k in (_HEADER, _SIE_HEADER) if k not in names]
                if added:
                    message = {**message, "headers": [*answer, *added]}
            await send(message)

        await self.app(scope, receive, send_with_id)
