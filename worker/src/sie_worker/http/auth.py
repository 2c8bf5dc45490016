"""Bearer-token auth (``SIE_API_KEY``) on every path but the probes and metrics."""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from sie_worker.errors import Unauthorized
from sie_worker.http.errors import send_error

__all__ = ["OPEN_PATHS", "BearerAuth"]

OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
_SCHEME = len(b"bearer ")


class BearerAuth:
    passes_body_through = True  # sie_worker.http.wire: it never rewrites a body

    def __init__(self, app: ASGIApp, api_key: str | None) -> None:
        self.app = app
        self._expected = f"bearer {api_key}".encode() if api_key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._expected is None or scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        supplied = b""
        for name, value in scope["headers"]:
            if name == b"authorization":
                supplied = value
                break
        # The scheme is case-insensitive (RFC 7235: "bearer" is "Bearer"); the token is not.
        supplied = supplied[:_SCHEME].lower() + supplied[_SCHEME:]
        # Constant-time: the comparison does not reveal how much of the key matched.
        if not hmac.compare_digest(supplied, self._expected):
            await send_error(send, Unauthorized())
            return
        await self.app(scope, receive, send)
