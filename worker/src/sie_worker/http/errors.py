"""Every error the worker, the router and the gateway answer, in one shape, rendered here.

A :class:`~sie_worker.errors.SieError` becomes ``{"error": {"code", "message", "param"?}}``
with its status, its headers and ``X-SIE-Error-Code: <SIE's code>`` (from
:data:`~sie_worker.errors.SIE_ERROR_CODES`): as a response (:func:`error_response`),
straight from middleware before any route runs (:func:`send_error`), or, once a stream has
started, as its last server-sent event (:func:`sse_error_event`). Error bodies are JSON
whatever the request's ``Accept``.

One exception to "our code in ``error.code``": sie-sdk raises ``ModelLoadFailedError`` only
for a 502 whose *body* code is ``MODEL_LOAD_FAILED`` (it does not read the header there, and
an ``error`` object hides any ``detail`` one). So for a request that identifies itself as
sie-sdk (it sends ``X-SIE-SDK-Version`` on every call) a load failure's body carries SIE's
code, with ours kept beside it as ``worker_code``; every other client, and every other
error, gets our code in the body.
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

from sie_worker.errors import (
    SIE_ERROR_HEADER,
    SIE_LOAD_FAILED,
    MethodNotAllowed,
    NotFound,
    SieError,
)

__all__ = [
    "EXCEPTION_HANDLERS",
    "SDK_VERSION_HEADER",
    "error_body",
    "error_headers",
    "error_response",
    "from_sie_sdk",
    "send_error",
    "sse_error_event",
]

_log = logging.getLogger("sie_worker.http")
SDK_VERSION_HEADER = "x-sie-sdk-version"  # sent by sie-sdk on every request
# SIE codes the SDK reads from the body rather than from X-SIE-Error-Code.
_BODY_READ_CODES = frozenset({SIE_LOAD_FAILED})


def from_sie_sdk(headers: Mapping[str, str]) -> bool:
    """Whether the request comes from sie-sdk (``X-SIE-SDK-Version``)."""
    return bool(headers.get(SDK_VERSION_HEADER))


def error_body(error: SieError, *, sie_sdk: bool = False) -> dict[str, Any]:
    body = error.body()
    if sie_sdk and error.status == 502 and error.sie_code in _BODY_READ_CODES:
        body["error"] = {**body["error"], "code": error.sie_code, "worker_code": error.code}
    return body


def error_headers(error: SieError) -> dict[str, str]:
    return {**error.headers, SIE_ERROR_HEADER: error.sie_code}


def error_response(error: SieError, *, sie_sdk: bool = False) -> JSONResponse:
    return JSONResponse(
        error_body(error, sie_sdk=sie_sdk), status_code=error.status, headers=error_headers(error)
    )


async def send_error(send: Send, error: SieError) -> None:
    body = json.dumps(error_body(error)).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    headers += [(k.lower().encode(), v.encode()) for k, v in error_headers(error).items()]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def sse_error_event(error: SieError) -> bytes:
    return b"data: " + json.dumps(error.body()).encode() + b"\n\n"


async def _sie_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, SieError)
    return error_response(exc, sie_sdk=from_sie_sdk(request.headers))


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
