"""What the slot router and the gateway are alike as hops in front of their backends: the
client of their own calls to the backends (:class:`OwnCalls`; one try of a relayed request
on one backend is :class:`sie_worker.backends.table.Attempt`). Their app shell is the worker's too
(:func:`sie_worker.http.app_shell.app_shell`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import httpx
from starlette.responses import Response

from sie_worker.backends.hop_settings import HopSettings
from sie_worker.http.connections import Connections
from sie_worker.http.fan_out import Target, ask_all, fan_out
from sie_worker.http.headers import forward_headers
from sie_worker.http.relay import Upstream

__all__ = ["OwnCalls"]


class OwnCalls:
    """The client of a hop's own calls to its backends (polls, fan-outs, merged views): the
    one injected (tests: ``MockTransport``), else one built when the app starts and closed
    when it stops; and, while the app runs, the backends' idle connections for relays.
    :meth:`ask_all` and :meth:`fan_out` are those calls, for router and gateway alike."""

    def __init__(
        self,
        injected: httpx.AsyncClient | None,
        build: Callable[[], httpx.AsyncClient],
        app: str,
        settings: HopSettings,
    ) -> None:
        self._injected = injected
        self._client = injected
        self._build = build
        self._app = app
        self.settings = settings

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            raise RuntimeError(f"the {self._app} app was not started (lifespan not run)")
        return self._client

    async def ask_all(
        self, targets: Sequence[Target], path: str, client_headers: Iterable[tuple[bytes, bytes]]
    ) -> list[tuple[Target, Any]]:
        """GET ``path`` from every target at once, with the client's ``Authorization``:
        ``(target, JSON body)`` of those that answered 200, in order; the others left out."""
        auth = {k: v for k, v in forward_headers(client_headers) if k.lower() == "authorization"}
        return await ask_all(self.client, targets, path, auth, self.settings.poll_timeout_s)

    async def fan_out(self, upstream: Upstream, targets: Sequence[Target], header: str) -> Response:
        """``upstream`` to every target at once: the first failure, else the first answer;
        ``header`` lists the targets (:func:`sie_worker.http.fan_out.fan_out`)."""
        connect, read = self.settings.connect_timeout_s, self.settings.read_timeout_s
        limits = httpx.Timeout(connect=connect, read=read, write=read, pool=connect)
        return await fan_out(self.client, upstream, targets, header=header, limits=limits)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[tuple[httpx.AsyncClient, Connections]]:
        client = self._client = self._injected or self._build()
        connections = Connections()
        try:
            yield client, connections
        finally:
            connections.close()
            if self._injected is None:
                await client.aclose()
