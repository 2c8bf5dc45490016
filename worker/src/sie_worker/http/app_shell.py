"""The app shell every SIE app shares (the worker, the slot router, the gateway): request ids,
request limits, bearer auth, one error rendering, and no redirects, around the app's own
routes and lifespan."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Protocol

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import BaseRoute

from sie_worker.http.auth import BearerAuth
from sie_worker.http.errors import EXCEPTION_HANDLERS
from sie_worker.http.request_id import RequestId
from sie_worker.http.request_limits import RequestLimits
from sie_worker.http.wire import WiredStarlette

__all__ = ["ShellSettings", "app_shell"]


class ShellSettings(Protocol):
    """What the shell reads of an app's settings (the worker's, the router's, the
    gateway's): ``SIE_MAX_BODY_BYTES`` and ``SIE_API_KEY``."""

    @property
    def max_body_bytes(self) -> int: ...

    @property
    def api_key(self) -> str | None: ...


def app_shell(
    routes: Sequence[BaseRoute],
    settings: ShellSettings,
    lifespan: Callable[[Starlette], AbstractAsyncContextManager[None]],
) -> Starlette:
    """An app over ``routes``: bodies over ``settings.max_body_bytes`` are refused, and with
    an ``api_key`` every request but the probes and metrics must bear it."""
    app = WiredStarlette(
        routes=list(routes),
        middleware=[
            Middleware(RequestId),
            Middleware(RequestLimits, max_bytes=settings.max_body_bytes),
            Middleware(BearerAuth, api_key=settings.api_key),
        ],
        exception_handlers=dict(EXCEPTION_HANDLERS),
        lifespan=lifespan,
    )
    # why: never answer with a redirect (sie-sdk follows none; a POST would not survive one)
    app.router.redirect_slashes = False
    return app
