"""A fault the soak found in the request path: connecting to an engine that just crashed.

When an engine dies while requests are on their way to it, the TCP connect can succeed and
the connection be reset at once (httpcore with anyio used to raise ``AttributeError`` there,
and the worker answered ``500 internal_error``). The worker's engine calls now go through
its own client (``sie_worker.http.upstream``); a reset right after the accept, or before any
byte of the answer, is still ``engine_unavailable`` (502) and the lease is given back.
"""

from __future__ import annotations

import asyncio
import socket
import struct

import pytest
from sie_worker.errors import EngineUnavailable
from sie_worker.worker.proxy import Lease, forward


async def _resetting_server() -> tuple[asyncio.Server, int]:
    """Accepts and resets every connection (SO_LINGER 0: an RST, not a FIN)."""

    def reset(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()

    server = await asyncio.start_server(reset, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


@pytest.mark.parametrize("stream", [False, True])
def test_a_connection_reset_right_after_the_accept_is_engine_unavailable_not_500(
    stream: bool,
) -> None:
    released: list[bool] = []

    async def send() -> None:
        server, port = await _resetting_server()
        lease = Lease(
            "org/m", f"http://127.0.0.1:{port}", 5.0, on_release=lambda: released.append(True)
        )
        async with server:
            await forward(
                lease,
                "/v1/completions",
                b'{"model": "org/m", "prompt": "x"}',
                {"content-type": "application/json"},
                stream=stream,
                request_id="r1",
            )

    with pytest.raises(EngineUnavailable, match="org/m: engine connection failed"):
        asyncio.run(send())
    assert released == [True]  # the lease is given back either way
