"""Relay one request to the slot the policy picks, streaming the answer without buffering.

Each relayed request gets its own connection to the slot (``sie_worker.http.stream_client``,
parsed by httptools), closed once the answer is complete: httpx's pool bookkeeping and
per-chunk parsing were most of the router's CPU with many streams (``docs/benchmarks.md``).
Calls fanned out to several slots (:func:`fan_out`) keep using httpx.

The whole exchange runs inside a cancel scope that the client going away cancels (the
upstream request is closed, so the engine stops working for nobody); each try on a slot
runs in its own scope that the slot leaving rotation cancels (the request fails with
``engine_unavailable`` instead of hanging). A request that never reached the worker (its
connection was refused, or was still being made when the slot left rotation) is routed
again, without that slot. Worker answers, errors included, pass through unchanged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import anyio
import httpx
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from sie_worker.errors import EngineTimeout, EngineUnavailable, SieError
from sie_worker.http.errors import error_response, sse_error_event
from sie_worker.http.stream_client import StreamResponse, open_stream
from sie_worker.router.policy import Decision
from sie_worker.router.settings import RouterSettings
from sie_worker.router.state import SlotTable

__all__ = [
    "HOP_BY_HOP",
    "RelayResponse",
    "Upstream",
    "fan_out",
    "forward_headers",
]

logger = logging.getLogger("sie_worker.router")

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "x-sie-slot",
    }
)
# Response headers the router's own server writes: relaying the worker's too would repeat them.
_SET_BY_SERVER = frozenset({"date", "server"})

Route = Callable[[frozenset[int]], Awaitable[Decision]]
# Unsent bytes held per relayed answer: past this, reading from the slot pauses until the
# client has taken them, so a slow client slows its slot's stream instead of growing memory.
_HIGH_WATER = 1024 * 1024


@dataclass(frozen=True)
class Upstream:
    """What to send to the chosen slot: the client's request, minus hop-by-hop headers."""

    method: str
    target: str  # raw path and query, as the client sent them
    headers: tuple[tuple[str, str], ...]
    body: bytes
    model: str | None  # the model the request is for, when it names one


def forward_headers(headers: list[tuple[bytes, bytes]]) -> tuple[tuple[str, str], ...]:
    return tuple(
        (k.decode("latin-1"), v.decode("latin-1"))
        for k, v in headers
        if k.decode("latin-1").lower() not in HOP_BY_HOP
    )


@dataclass
class _Outcome:
    slot: int | None = None
    status: int | None = None
    started: bool = False
    sse: bool = False
    slot_down: bool = False
    client_gone: bool = False
    error: SieError | None = None


class RelayResponse(Response):
    """An ASGI response that routes, relays and accounts for one request."""

    def __init__(
        self,
        table: SlotTable,
        upstream: Upstream,
        route: Route,
        *,
        arrived: float | None = None,
    ) -> None:
        super().__init__(status_code=200)
        self._table = table
        self._upstream = upstream
        self._route = route
        self._arrived = time.monotonic() if arrived is None else arrived

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        outcome = _Outcome()
        async with anyio.create_task_group() as tg:
            tg.start_soon(_watch_disconnect, receive, tg.cancel_scope, outcome)
            try:
                await self._relay(send, outcome)
            finally:
                tg.cancel_scope.cancel()
        metrics = self._table.metrics
        metrics.duration.observe(time.monotonic() - self._arrived)
        if outcome.client_gone:
            return
        if outcome.slot_down and outcome.error is None:
            outcome.error = EngineUnavailable(
                f"slot {outcome.slot} stopped answering while serving this request"
            )
        if outcome.error is None:
            return
        if not outcome.started:
            response = error_response(outcome.error)
            if outcome.slot is not None:
                response.headers["x-sie-slot"] = str(outcome.slot)
                metrics.requests.labels(
                    slot=str(outcome.slot), status=str(response.status_code)
                ).inc()
            await response(scope, receive, send)
        elif outcome.sse:
            event = sse_error_event(outcome.error)
            await send({"type": "http.response.body", "body": event, "more_body": False})
        else:
            # Headers are out and the body is cut short: abort the connection so the client
            # cannot mistake a partial body for a whole one.
            raise outcome.error

    async def _relay(self, send: Send, outcome: _Outcome) -> None:
        exclude: set[int] = set()
        while True:
            try:
                decision = await self._route(frozenset(exclude))
            except SieError as exc:
                outcome.error = exc
                return
            if not await self._attempt(decision, send, outcome):
                return
            exclude.add(decision.slot)

    async def _attempt(self, decision: Decision, send: Send, outcome: _Outcome) -> bool:
        """One try on one slot; True when nothing reached the slot's worker (route again):
        it refused the connection, or left rotation before the request was written."""
        table, model = self._table, self._upstream.model
        slot = decision.slot
        state = table.slots[slot]
        table.metrics.decisions.labels(reason=decision.reason).inc()
        outcome.slot = slot
        table.dispatched(slot, model, decision.reason)
        queued = model is not None and decision.reason != "ready"  # waits for its model
        if queued:
            table.metrics.queued.inc()
        # The slot leaving rotation cancels this attempt only, so the request can be routed
        # again when it never reached the worker.
        attempt = anyio.CancelScope()
        written = False

        def request_written() -> None:
            nonlocal written
            written = True

        state.aborts.add(attempt.cancel)
        response: StreamResponse | None = None
        upstream, settings = self._upstream, table.settings
        try:
            with attempt:
                try:
                    with _translate(slot, state.url):
                        response = await open_stream(
                            state.url + upstream.target,
                            upstream.body,
                            upstream.headers,
                            method=upstream.method,
                            connect_timeout_s=settings.connect_timeout_s,
                            read_timeout_s=settings.read_timeout_s,
                            high_water=_HIGH_WATER,
                            on_connected=request_written,
                        )
                except _Refused as exc:
                    state.aborts.discard(attempt.cancel)
                    table.mark_down(slot, str(exc))
                    return True
                finally:
                    if queued:
                        table.metrics.queued.dec()
                await self._pass_on(response, decision, send, outcome)
            if attempt.cancelled_caught:
                if not written:
                    return True
                outcome.slot_down = True
        except SieError as exc:
            outcome.error = exc
        finally:
            state.aborts.discard(attempt.cancel)
            if response is not None:
                response.close()
            table.finished(
                slot,
                model,
                changed=decision.reason != "ready",
                served=outcome.status is not None and outcome.status < 400,
            )
        return False

    async def _pass_on(
        self, response: StreamResponse, decision: Decision, send: Send, outcome: _Outcome
    ) -> None:
        """Relay the slot's answer, head then body, to the client as it arrives."""
        slot, url = decision.slot, self._table.slots[decision.slot].url
        outcome.status = response.status
        content_type = next((v for k, v in response.headers if k == "content-type"), "")
        outcome.sse = content_type.startswith("text/event-stream")
        headers = [
            (k.encode("latin-1"), v.encode("latin-1"))
            for k, v in response.headers
            if (k not in HOP_BY_HOP or k == "content-length") and k not in _SET_BY_SERVER
        ]
        headers.append((b"x-sie-slot", str(slot).encode()))
        headers.append((b"x-sie-route-reason", decision.reason.encode()))
        start = {"type": "http.response.start", "status": response.status, "headers": headers}
        await send(start)
        outcome.started = True
        self._table.metrics.requests.labels(slot=str(slot), status=str(response.status)).inc()
        with _translate(slot, url):
            while not response.drained:
                # Everything that arrived since the last write leaves in one write.
                chunk = await response.take()
                if chunk:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            if response.error is not None:
                raise response.error
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def fan_out(
    table: SlotTable, client: httpx.AsyncClient, upstream: Upstream, slots: Sequence[int]
) -> Response:
    """Send one call to several slots at once (unload everywhere, write a config to all).

    The answer is the first failure in slot order, else the first slot's answer; its
    ``X-SIE-Slot`` header lists every slot the call went to.
    """
    results: dict[int, httpx.Response | SieError] = {}

    async def one(slot: int) -> None:
        state = table.slots[slot]
        request = _build_request(client, table.settings, upstream, state.url)
        try:
            with _translate(slot, state.url):
                results[slot] = await client.send(request)
        except SieError as exc:
            results[slot] = exc
        finally:
            table.poke(slot)

    async with anyio.create_task_group() as tg:
        for slot in slots:
            tg.start_soon(one, slot)
    ordered = [results[s] for s in sorted(results)]
    failures = [r for r in ordered if isinstance(r, SieError) or r.status_code >= 400]
    chosen = failures[0] if failures else ordered[0]
    if isinstance(chosen, SieError):
        response: Response = error_response(chosen)
    else:
        response = Response(
            chosen.content,
            status_code=chosen.status_code,
            headers={
                k: v
                for k, v in chosen.headers.items()
                if k.lower() not in HOP_BY_HOP and k.lower() not in _SET_BY_SERVER
            },
        )
    response.headers["x-sie-slot"] = ",".join(str(s) for s in sorted(results))
    return response


def _build_request(
    client: httpx.AsyncClient, settings: RouterSettings, upstream: Upstream, base_url: str
) -> httpx.Request:
    timeout = httpx.Timeout(
        connect=settings.connect_timeout_s,
        read=settings.read_timeout_s,
        write=settings.read_timeout_s,
        pool=settings.connect_timeout_s,
    )
    has_body = upstream.body or upstream.method not in ("GET", "HEAD", "DELETE")
    return client.build_request(
        upstream.method,
        httpx.URL(base_url + upstream.target),
        headers=list(upstream.headers),
        content=upstream.body if has_body else None,
        timeout=timeout,
    )


class _Refused(EngineUnavailable):
    """The slot's worker refused the connection: the request never reached it."""


@contextmanager
def _translate(slot: int, url: str) -> Iterator[None]:
    """Turn httpx's transport errors into the worker's error codes, chained."""
    try:
        yield
    except httpx.ConnectError as exc:
        raise _Refused(f"slot {slot} ({url}) refused the connection: {exc}") from exc
    except httpx.TimeoutException as exc:
        if isinstance(exc, httpx.ConnectTimeout | httpx.PoolTimeout):
            raise EngineUnavailable(f"slot {slot} ({url}) did not accept a connection") from exc
        raise EngineTimeout(
            f"slot {slot} ({url}) sent nothing within the router's read timeout"
        ) from exc
    except httpx.TransportError as exc:
        raise EngineUnavailable(
            f"slot {slot} ({url}) dropped the request: {type(exc).__name__}: {exc}"
        ) from exc


async def _watch_disconnect(receive: Receive, scope: anyio.CancelScope, outcome: _Outcome) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            outcome.client_gone = True
            scope.cancel()
            return
