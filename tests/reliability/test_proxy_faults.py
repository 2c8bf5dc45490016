"""A fault the soak found in the request path: connecting to an engine that just crashed.

When an engine dies while requests are on their way to it, the TCP connect can succeed and
the connection be reset before httpcore asks for its TLS object; anyio then raises
``AttributeError: 'NoneType' object has no attribute 'getpeername'`` (its socket is already
gone) instead of a connect error, and the worker answered ``500 internal_error`` where
``engine_unavailable`` belongs. Seen about once per second with engines crashing under
concurrent load (soak, and a 12-client stress with ``fake.die_after``); reproduced here
deterministically by a transport that fails the same way.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from sie_worker.errors import EngineUnavailable
from sie_worker.worker.proxy import Lease, forward


def _reset_during_connect(request: httpx.Request) -> httpx.Response:
    # What httpcore 1.0.9 + anyio 4.16 raise when the peer resets right after accepting.
    raise AttributeError("'NoneType' object has no attribute 'getpeername'")


def test_a_connection_reset_while_connecting_is_engine_unavailable_not_500() -> None:
    released: list[bool] = []
    lease = Lease("org/m", "http://127.0.0.1:30001", 5.0, on_release=lambda: released.append(True))

    async def send() -> None:
        transport = httpx.MockTransport(_reset_during_connect)
        async with httpx.AsyncClient(transport=transport) as client:
            await forward(
                client,
                lease,
                "/v1/completions",
                b'{"model": "org/m", "prompt": "x"}',
                {"content-type": "application/json"},
                stream=False,
                request_id="r1",
            )

    with pytest.raises(EngineUnavailable):
        asyncio.run(send())
    assert released == [True]  # the lease is given back either way
