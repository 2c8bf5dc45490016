"""Bearer-token check for the slot router (``SIE_API_KEY``), as pure ASGI middleware.

Probes and metrics stay open so kubelet and Prometheus need no key; everything else needs
``Authorization: Bearer <key>``, compared in constant time. The header is forwarded to the
workers, which check the same key.
"""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from sie_worker.errors import Unauthorized
from sie_worker.router_relay import error_response

__all__ = ["OPEN_PATHS", "BearerAuth"]

OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


class BearerAuth:
    def __init__(self, app: ASGIApp, *, api_key: str | None) -> None:
        self.app = app
        self._expected = f"Bearer {api_key}".encode() if api_key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            self._expected is None
            or scope["type"] != "http"
            or scope["path"] in OPEN_PATHS
            or self._authorized(scope)
        ):
            await self.app(scope, receive, send)
            return
        await error_response(Unauthorized())(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        assert self._expected is not None
        given = b""
        for key, value in scope["headers"]:
            if key.lower() == b"authorization":
                given = value
                break
        return hmac.compare_digest(given, self._expected)
