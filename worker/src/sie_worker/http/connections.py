"""Idle kept-alive connections to upstreams, for the hops' requests to reuse.

Connecting costs each hop more than relaying a short stream's events (``docs/benchmarks.md``,
Data path), so a hop that passes :class:`Connections` to
:func:`~sie_worker.http.upstream.open_stream` gets back the connection of every answer that
ended as HTTP/1.1 keep-alive framing says. An idle connection is closed by this side after
``idle_s``, before the upstream's own keep-alive timeout (uvicorn's default, which SGLang and
vLLM keep, is 5 s), so the TIME_WAIT stays on the hop's ephemeral port; anything the
upstream sends while it is idle, its close included, ends it.
"""

from __future__ import annotations

import asyncio

__all__ = ["Connections", "Key"]

Key = tuple[str, int]  # an upstream's host and port


class Connections:
    """Idle keep-alive connections to upstreams, by host and port, for :func:`open_stream`
    to reuse (the most recent first). Each is closed after ``idle_s`` unused, or when the
    upstream closes it; at most ``max_idle`` are kept per upstream. :meth:`close` closes
    every idle one and keeps none from then on (an app's shutdown, an engine's stop)."""

    def __init__(self, *, idle_s: float = 3.0, max_idle: int = 512) -> None:
        self.idle_s = idle_s
        self.max_idle = max_idle
        self.closed = False
        self._idle: dict[Key, list[_Idle]] = {}

    def idle(self) -> int:
        """How many idle connections are kept now."""
        return sum(len(entries) for entries in self._idle.values())

    def close(self) -> None:
        self.closed = True
        idle, self._idle = self._idle, {}
        for entries in idle.values():
            for entry in entries:
                entry.close()

    def _take(self, key: Key) -> asyncio.Transport | None:
        entries = self._idle.get(key)
        while entries:
            entry = entries.pop()
            transport = entry.detach()
            if transport is not None:
                return transport
        return None

    def _give_back(self, key: Key, transport: asyncio.Transport) -> None:
        entries = self._idle.setdefault(key, [])
        if self.closed or len(entries) >= self.max_idle or transport.is_closing():
            transport.close()
            return
        entries.append(_Idle(self, key, transport))

    def _forget(self, entry: _Idle) -> None:
        entries = self._idle.get(entry.key)
        if entries is not None and entry in entries:
            entries.remove(entry)


class _Idle(asyncio.Protocol):
    """The protocol of a connection while it waits in :class:`Connections`: anything the
    upstream sends now (bytes, its close) ends it."""

    def __init__(self, pool: Connections, key: Key, transport: asyncio.Transport) -> None:
        self.pool, self.key = pool, key
        self._transport: asyncio.Transport | None = transport
        transport.set_protocol(self)
        transport.resume_reading()  # so that the upstream's close is seen while idle
        self._timer = asyncio.get_running_loop().call_later(pool.idle_s, self.close)

    def detach(self) -> asyncio.Transport | None:
        """The connection, for a new request (None: it was closed meanwhile)."""
        self._timer.cancel()
        transport, self._transport = self._transport, None
        if transport is None or transport.is_closing():
            return None
        return transport

    def close(self) -> None:
        self._timer.cancel()
        transport, self._transport = self._transport, None
        self.pool._forget(self)
        if transport is not None:
            transport.close()

    def data_received(self, data: bytes) -> None:
        self.close()  # an idle upstream has nothing to say: the connection is not reusable

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._timer.cancel()
        self.pool._forget(self)
