"""An engine on a real 127.0.0.1 socket whose answers a test scripts byte by byte.

For the proxy's stream tests, which need what the fake engine subprocess cannot be told to
do with precise timing: chunks split mid-event, several chunks in one socket write, a
stall, a connection dropped mid-body, a body delimited by the connection's end.

``async with scripted_engine(script) as engine:`` serves on ``engine.base_url``; for every
request ``script(request)`` returns a :class:`Reply`. Its ``body`` yields what to send:
``bytes`` is one HTTP chunk in its own write, a ``list`` of ``bytes`` is several chunks in a
single write, :data:`HANG` stops sending (the connection stays open until the client
leaves) and :data:`DROP` closes the connection at once. ``engine.client_closed`` is set
when the client closed a connection while the script still had things to send, or after it
had finished. A chunked answer keeps its connection for the next request (HTTP/1.1
keep-alive); with ``keep_alive=False`` the engine instead closes it when the next request
comes, unanswered (a server that timed the connection out just then).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DROP",
    "HANG",
    "EngineRequest",
    "Reply",
    "ScriptedEngine",
    "answer_with",
    "scripted_engine",
]

HANG = object()
DROP = object()


@dataclass
class EngineRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Reply:
    status: int = 200
    body: AsyncIterator[object] | None = None
    headers: dict[str, str] = field(default_factory=lambda: {"content-type": "text/event-stream"})
    chunked: bool = True  # False: no framing, the body ends with the connection
    head: bytes | None = None  # raw status line and headers, replacing the above


Script = Callable[[EngineRequest], Reply]


def answer_with(*items: object, **fields: Any) -> Script:
    """A script answering every request with a body of ``items`` (and :class:`Reply`'s
    other ``fields``)."""

    def script(request: EngineRequest) -> Reply:
        async def body() -> AsyncIterator[object]:
            for item in items:
                yield item

        return Reply(body=body(), **fields)

    return script


@dataclass
class ScriptedEngine:
    base_url: str
    requests: list[EngineRequest] = field(default_factory=list)
    client_closed: asyncio.Event = field(default_factory=asyncio.Event)
    produced: int = 0  # body bytes written so far, over every request
    connections: int = 0  # accepted so far


async def _serve(
    engine: ScriptedEngine,
    script: Script,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    keep_alive: bool,
) -> None:
    try:
        while (answered := await _answer(engine, script, reader, writer)) and keep_alive:
            pass
        if answered and not await reader.read(1):  # the client closed its end (we keep ours open)
            engine.client_closed.set()
    except (ConnectionError, asyncio.IncompleteReadError, RuntimeError):
        # RuntimeError: uvloop's answer to a write on a transport the client has closed.
        engine.client_closed.set()
    finally:
        writer.close()


async def _answer(
    engine: ScriptedEngine,
    script: Script,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
) -> bool:
    """Answer one request; True when the connection can take another, False when the
    script ended it (HANG, DROP)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    length = re.fullmatch(r"\d+", headers.get("content-length", "0"))
    body = await reader.readexactly(int(length.group()) if length else 0)
    request = EngineRequest(method, path, headers, body)
    engine.requests.append(request)
    reply = script(request)
    if reply.head is not None:
        writer.write(reply.head)
    else:
        names = dict(reply.headers)
        if reply.chunked:
            names["transfer-encoding"] = "chunked"
        status = f"HTTP/1.1 {reply.status} X\r\n"
        fields = "".join(f"{k}: {v}\r\n" for k, v in names.items())
        writer.write((status + fields + "\r\n").encode())
    await writer.drain()
    if reply.body is not None:
        async for item in reply.body:
            if item is HANG:
                await reader.read()  # until the client leaves
                engine.client_closed.set()
                return False
            if item is DROP:
                writer.transport.abort()
                return False
            parts = item if isinstance(item, list) else [item]
            assert all(isinstance(part, bytes) for part in parts)
            frame = b"".join(
                b"%x\r\n%b\r\n" % (len(part), part) if reply.chunked else part for part in parts
            )
            engine.produced += sum(len(part) for part in parts)
            writer.write(frame)
            await writer.drain()
    if reply.chunked:
        writer.write(b"0\r\n\r\n")
        await writer.drain()
    if not reply.chunked:
        writer.close()  # the body ends with the connection
        return False
    return True


@contextlib.asynccontextmanager
async def scripted_engine(
    script: Script, *, send_buffer: int | None = None, keep_alive: bool = True
) -> AsyncIterator[ScriptedEngine]:
    """Serve ``script`` on a free 127.0.0.1 port. ``send_buffer`` caps the kernel's send
    buffer of each connection (bytes), so that backpressure reaches the script quickly;
    ``keep_alive=False``: each connection's next request is met by its close."""
    engine = ScriptedEngine(base_url="")
    tasks: set[asyncio.Task[None]] = set()
    writers: set[asyncio.StreamWriter] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if send_buffer is not None and sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
            writer.transport.set_write_buffer_limits(high=send_buffer)
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        writers.add(writer)
        engine.connections += 1
        try:
            await _serve(engine, script, reader, writer, keep_alive)
        finally:
            tasks.discard(task)
            writers.discard(writer)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    engine.base_url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield engine
    finally:
        server.close()
        for writer in list(writers):
            writer.transport.abort()  # ends every script at its next read or write
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()
