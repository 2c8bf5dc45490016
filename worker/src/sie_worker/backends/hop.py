"""What the slot router and the gateway are alike as hops in front of their backends: the
client of their own calls to the backends (:class:`OwnCalls`) and one try of a relayed
request on one backend (:class:`BackendDispatch`, the shared part of
:class:`sie_worker.http.relay.Dispatch`). Their app shell is the worker's too
(:func:`sie_worker.http.app_shell.app_shell`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Hashable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx

from sie_worker.backends.table import Backend
from sie_worker.http.connections import Connections

__all__ = ["BackendDispatch", "OwnCalls"]


class OwnCalls:
    """The client of a hop's own calls to its backends (polls, fan-outs, merged views): the
    one injected (tests: ``MockTransport``), else one built when the app starts and closed
    when it stops; and, while the app runs, the backends' idle connections for relays."""

    def __init__(
        self, injected: httpx.AsyncClient | None, build: Callable[[], httpx.AsyncClient], app: str
    ) -> None:
        self._injected = injected
        self._client = injected
        self._build = build
        self._app = app

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            raise RuntimeError(f"the {self._app} app was not started (lifespan not run)")
        return self._client

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


@dataclass
class BackendDispatch:
    """One try on ``backend``: ``key`` is what a retry excludes, ``name`` is for messages."""

    backend: Backend
    key: Hashable
    name: str

    @property
    def url(self) -> str:
        return self.backend.url

    @property
    def aborts(self) -> set[Callable[[], None]]:
        return self.backend.aborts

    @property
    def resume(self) -> bool:
        return True

    def connected(self) -> None:
        return
