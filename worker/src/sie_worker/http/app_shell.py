"""The app shell every SIE app shares (the worker, the slot router, the gateway): request
ids, request limits and bearer auth before any route (``front_door``), one error
rendering, and no redirects, around the app's own routes and lifespan."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Protocol

from starlette.applications import Starlette
from starlette.routing import BaseRoute

from sie_worker.http.front_door import FrontDoor

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
    app = FrontDoor(
        list(routes),
        lifespan=lifespan,
        max_bytes=settings.max_body_bytes,
        api_key=settings.api_key,
    )
    # why: never answer with a redirect (sie-sdk follows none; a POST would not survive one)
    app.router.redirect_slashes = False
    return app
