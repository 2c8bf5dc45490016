"""Every error the worker, the router and the gateway answer, in one shape, rendered here.

A :class:`~sie_worker.errors.SieError` becomes ``{"error": {"code", "message"}}`` with its
status and headers: as a response (:func:`error_response`), straight from middleware before
any route runs (:func:`send_error`), or, once a stream has started, as its last server-sent
event (:func:`sse_error_event`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Send

from sie_worker.errors import MethodNotAllowed, NotFound, SieError

__all__ = ["EXCEPTION_HANDLERS", "error_response", "send_error", "sse_error_event"]

_log = logging.getLogger("sie_worker.http")


def error_response(error: SieError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


async def send_error(send: Send, error: SieError) -> None:
    body = json.dumps(error.body()).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    headers += [(k.lower().encode(), v.encode()) for k, v in error.headers.items()]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def sse_error_event(error: SieError) -> bytes:
    return b"data: " + json.dumps(error.body()).encode() + b"\n\n"


async def _sie_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, SieError)
    return error_response(exc)


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own refusals (no route, wrong method) in the same shape."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow")
        return error_response(
            MethodNotAllowed(
                f"{request.method} is not allowed on {request.url.path}"
                + (f"; use {allowed}" if allowed else ""),
                headers={"Allow": allowed} if allowed else None,
            )
        )
    if exc.status_code == 404:
        return error_response(NotFound(f"no endpoint at {request.url.path}"))
    return error_response(SieError(str(exc.detail), status=exc.status_code))


async def _unexpected_error(request: Request, exc: Exception) -> Response:
    _log.exception("unexpected error on %s %s", request.method, request.url.path)
    return error_response(SieError(f"internal error: {type(exc).__name__}"))


# The exception handlers of every app of the package: one place renders every error.
EXCEPTION_HANDLERS: Mapping[Any, Callable[[Request, Exception], Awaitable[Response]]] = {
    SieError: _sie_error,
    HTTPException: _http_error,
    Exception: _unexpected_error,
}
