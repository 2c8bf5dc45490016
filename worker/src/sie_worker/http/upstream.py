"""One request to an upstream (an engine, a worker, a pod): the engine call of every hop's
relay, on a new connection or on an idle one kept alive by
:class:`~sie_worker.http.connections.Connections`.

:func:`open_stream` connects, sends the request and returns once the final head of the
answer has arrived; :class:`~sie_worker.http.upstream_answer.UpstreamAnswer` then hands the
body over as it is read. A request whose reused connection turns out closed before any
byte of the answer is sent once more on a new one when the request's method is idempotent
(RFC 9112, 9.3.1: a POST the upstream may have acted on is never sent twice; the caller
answers with the error instead).

Failures are raised as httpx's exception types (``ConnectError``, ``ConnectTimeout``,
``ReadTimeout``, ``ReadError``, ``RemoteProtocolError``) and a passed deadline as
:class:`~sie_worker.http.deadlines.DeadlineHit`, so callers translate every client's
failures in one place: :func:`translate_errors`, into error codes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

import httpx

from sie_worker.errors import EngineTimeout, EngineUnavailable
from sie_worker.http.connections import Connections
from sie_worker.http.deadlines import Deadlines, Limit
from sie_worker.http.upstream_answer import UpstreamAnswer, never

__all__ = ["IDEMPOTENT", "Refused", "open_stream", "translate_errors"]

# RFC 9110 (9.2.2): what may be sent again when the first try may have reached the upstream.
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})


async def open_stream(
    url: str,
    body: bytes,
    headers: Iterable[tuple[str, str]],
    *,
    method: str = "POST",
    connect_timeout_s: float,
    read_timeout_s: float | None = None,
    deadlines: Deadlines | None = None,
    high_water: int,
    stop_after: Callable[[bytes, bytes], bool] = never,
    on_connected: Callable[[], None] | None = None,
    connections: Connections | None = None,
) -> UpstreamAnswer:
    """Send ``method`` with ``body`` to ``url`` (``http://host:port/path?query``) and return
    once the response head has arrived: on an idle connection of ``connections`` when it
    has one to that upstream (and the connection goes back to it once the answer has
    ended), else on a new connection. ``deadlines`` bound the answer (else just
    ``read_timeout_s`` between reads). ``headers`` must not carry Host, Content-Length or
    other hop-by-hop headers: this client writes its own. ``on_connected`` is called once a
    connection is up, just before the request is written: cancelled before that, nothing
    reached the server. A reused connection that the upstream closed before answering is
    tried again on a new one only for an idempotent ``method``."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise httpx.UnsupportedProtocol(f"only http:// URLs are streamed, got {url!r}")
    host, port = parts.hostname, parts.port or 80
    if deadlines is None:
        read = Limit("read_timeout_s", read_timeout_s) if read_timeout_s is not None else None
        deadlines = Deadlines(read)
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    lines = [f"{method} {target} HTTP/1.1", f"Host: {parts.netloc}"]
    for name, value in headers:
        if "\r" in name or "\n" in name or "\r" in value or "\n" in value:
            continue  # never let a header value split the request
        lines.append(f"{name}: {value}")
    if body or method not in ("GET", "HEAD", "DELETE", "OPTIONS"):
        lines.append(f"Content-Length: {len(body)}")
    request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "replace") + body
    key = (host, port)

    def protocol() -> UpstreamAnswer:
        return UpstreamAnswer(
            deadlines,
            high_water,
            stop_after,
            head_only=method == "HEAD",
            connections=connections,
            key=key,
        )

    while True:
        idle = connections._take(key) if connections is not None else None
        if idle is not None:
            response = protocol()
            response.adopt(idle)
        else:
            response = await _connect(protocol, host, port, connect_timeout_s)
        if on_connected is not None:
            on_connected()
        response.send(request)
        try:
            await response.wait_head()
        except (httpx.RemoteProtocolError, httpx.ReadError):
            response.close()
            if response.reused and response.closed_silent and method in IDEMPOTENT:
                continue  # closed idle by the upstream, maybe before it read the request

            raise
        except BaseException:
            response.close()
            raise
        return response


async def _connect(
    protocol: Callable[[], UpstreamAnswer], host: str, port: int, timeout_s: float
) -> UpstreamAnswer:
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout_s):
            _, response = await loop.create_connection(protocol, host, port)
    except TimeoutError:
        raise httpx.ConnectTimeout(f"connecting to {host}:{port} timed out") from None
    except OSError as exc:
        raise httpx.ConnectError(f"cannot connect to {host}:{port}: {exc}") from exc
    return response


class Refused(EngineUnavailable):
    """The backend refused the connection: the request never reached it."""


@contextmanager
def translate_errors(name: str, url: str) -> Iterator[None]:
    """Turn httpx's transport errors (both clients raise them) into error codes, chained."""
    try:
        yield
    except httpx.ConnectError as exc:
        raise Refused(f"{name} ({url}) refused the connection: {exc}") from exc
    except httpx.TimeoutException as exc:
        if isinstance(exc, httpx.ConnectTimeout | httpx.PoolTimeout):
            raise EngineUnavailable(f"{name} ({url}) did not accept a connection") from exc
        raise EngineTimeout(f"{name} ({url}) sent nothing within the read timeout") from exc
    except httpx.TransportError as exc:
        raise EngineUnavailable(
            f"{name} ({url}) dropped the request: {type(exc).__name__}: {exc}"
        ) from exc
