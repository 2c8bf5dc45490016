"""An httpx transport on :func:`~sie_worker.http.upstream.open_stream`: the hops' own calls.

The slot router and the gateway poll their backends (``/v1/models``, ``/v1/devices``,
``/readyz``) every half second or so and fan calls out to them; through httpx's default
transport (httpcore, h11, anyio) each such call costs a hop about a millisecond of CPU here,
more than relaying a whole 50-token stream's events (``docs/benchmarks.md``, Data path).
This transport keeps httpx's client (its API, timeouts, exception types and the tests'
``MockTransport``) and sends each request with the relays' own client instead: one write,
httptools parsing the answer in C, and the answer's connection kept alive for the next call
in :class:`~sie_worker.http.connections.Connections`. ``https://`` URLs (never used between
the hops) go through httpx's default transport.
"""

from __future__ import annotations

import httpx

from sie_worker.http.connections import Connections
from sie_worker.http.upstream import open_stream

__all__ = ["MAX_ANSWER_BYTES", "UpstreamTransport", "hop_client"]

# An answer larger than this fails with RemoteProtocolError rather than being cut short.
MAX_ANSWER_BYTES = 256 * 1024 * 1024
# Request headers this client writes itself (open_stream), or that only concern one hop.
_OWN_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection"})
_DEFAULT_CONNECT_S = 5.0


class UpstreamTransport(httpx.AsyncBaseTransport):
    """Sends each request with :func:`open_stream` on a kept-alive connection."""

    def __init__(self, *, idle_s: float = 3.0) -> None:
        self.connections = Connections(idle_s=idle_s)
        self._tls: httpx.AsyncHTTPTransport | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.scheme != "http":
            if self._tls is None:
                self._tls = httpx.AsyncHTTPTransport(trust_env=False)
            return await self._tls.handle_async_request(request)
        timeout = request.extensions.get("timeout", {})
        body = await request.aread()
        headers = [(k, v) for k, v in request.headers.multi_items() if k not in _OWN_HEADERS]
        answer = await open_stream(
            str(request.url),
            body,
            headers,
            method=request.method,
            connect_timeout_s=timeout.get("connect") or _DEFAULT_CONNECT_S,
            read_timeout_s=timeout.get("read"),
            high_water=MAX_ANSWER_BYTES + 1,
            connections=self.connections,
        )
        try:
            content = await answer.read_all(MAX_ANSWER_BYTES + 1)
        finally:
            answer.close()
        if len(content) > MAX_ANSWER_BYTES:
            raise httpx.RemoteProtocolError(
                f"the answer from {request.url} is larger than {MAX_ANSWER_BYTES} bytes"
            )
        return httpx.Response(
            answer.status,
            headers=[(k, v) for k, v in answer.headers if k != "transfer-encoding"],
            content=content,
            request=request,
            extensions={"http_version": b"HTTP/1.1"},
        )

    async def aclose(self) -> None:
        self.connections.close()
        if self._tls is not None:
            await self._tls.aclose()


def hop_client(timeout: httpx.Timeout) -> httpx.AsyncClient:
    """The client a hop polls and fans out with: this transport, never the env's proxies."""
    return httpx.AsyncClient(trust_env=False, timeout=timeout, transport=UpstreamTransport())
