"""Real sockets for in-process tests: serve an ASGI app with uvicorn, put a TCP front on it.

``serve(app)`` runs ``app`` on an ephemeral 127.0.0.1 port in the test's event loop.
:class:`TcpFront` relays bytes to such a port and can make it misbehave the way a dead or
wedged worker does: :meth:`TcpFront.refuse` closes the listener and resets open
connections (new connections get ECONNREFUSED), :meth:`TcpFront.hang` keeps every
connection open but stops relaying bytes in both directions.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import anyio
import uvicorn
from sie_worker.http.server_protocol import http_protocol
from starlette.types import ASGIApp

__all__ = ["TcpFront", "serve"]


@contextlib.asynccontextmanager
async def serve(
    app: ASGIApp, *, lifespan: str = "auto", own_logging: bool = False
) -> AsyncIterator[int]:
    """Run ``app`` with uvicorn on an ephemeral 127.0.0.1 port in this event loop.

    It stops gracefully, so that the app's lifespan shutdown runs (the router's pollers
    end before the test's event loop does); requests still running after a second are
    cancelled. Apps without startup work may pass ``lifespan="off"``. uvicorn's loggers are
    silenced, unless ``own_logging``: then uvicorn configures none of them and the test's
    handlers and levels stay (as ``sie-worker serve`` runs it, ``log_config=None``)."""
    config = uvicorn.Config(
        app,
        http=http_protocol(),  # as the servers run
        host="127.0.0.1",
        port=0,
        # The cancelled requests of a hung test are expected.
        log_level=None if own_logging else "critical",
        log_config=None if own_logging else uvicorn.config.LOGGING_CONFIG,
        ws="none",
        lifespan=lifespan,
        timeout_graceful_shutdown=1,
    )
    server = uvicorn.Server(config)
    stopped = anyio.Event()

    async def run() -> None:
        try:
            await server.serve()
        finally:
            stopped.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        try:
            with anyio.fail_after(10):
                while not server.started:  # noqa: ASYNC110 - uvicorn offers no started event
                    await anyio.sleep(0.01)
            port: int = server.servers[0].sockets[0].getsockname()[1]
            yield port
        finally:
            # Shut down gracefully even when the test failed: a task group cancels its
            # tasks on an error, and uvicorn cancelled never closes its listening socket
            # (an unclosed-socket warning that later fails some unrelated test).
            server.should_exit = True
            with anyio.CancelScope(shield=True), anyio.move_on_after(10):
                await stopped.wait()


class TcpFront:
    """Listens on its own port and relays every connection to ``backend_port``."""

    def __init__(self, backend_port: int) -> None:
        self.backend_port = backend_port
        self.port = 0
        self._server: asyncio.Server | None = None
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        """Listen (again) on this front's port; the first call picks a free one."""
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def refuse(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._writers):
            writer.transport.abort()

    async def accept(self) -> None:
        if self._server is None:
            await self.start()

    def hang(self) -> None:
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    async def close(self) -> None:
        await self.refuse()
        # The aborted connections end their relays; a cancelled relay would be logged as
        # an error by asyncio's stream callback.
        self._flowing.set()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=5)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        try:
            back_reader, back_writer = await asyncio.open_connection("127.0.0.1", self.backend_port)
        except OSError:
            writer.transport.abort()
            self._writers.discard(writer)
            self._tasks.discard(task)
            return
        self._writers.add(back_writer)
        try:
            await asyncio.gather(self._pipe(reader, back_writer), self._pipe(back_reader, writer))
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            for end in (writer, back_writer):
                end.transport.abort()
                self._writers.discard(end)
            self._tasks.discard(task)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            await self._flowing.wait()
            writer.write(data)
            await writer.drain()
        # One side finished: end the whole connection, as a proxy without half-close would.
        writer.transport.abort()
