"""Every request and every answer carries an ``X-Request-Id``: the client's, else a new one."""

from __future__ import annotations

import re

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient

from sie_worker.errors import InvalidRequest
from sie_worker.http.errors import EXCEPTION_HANDLERS
from sie_worker.http.request_id import RequestId


async def _echo(request: Request) -> Response:
    return JSONResponse({"seen": request.headers.get("x-request-id")})


async def _fail(request: Request) -> Response:
    raise InvalidRequest("no")


def _client() -> TestClient:
    app = Starlette(
        routes=[Route("/echo", _echo), Route("/fail", _fail)],
        middleware=[Middleware(RequestId)],
        exception_handlers=dict(EXCEPTION_HANDLERS),
    )
    return TestClient(app)


def test_the_clients_request_id_is_kept_and_returned() -> None:
    with _client() as client:
        response = client.get("/echo", headers={"X-Request-Id": "abc-1"})
    assert response.json() == {"seen": "abc-1"}
    assert response.headers["x-request-id"] == "abc-1"


def test_a_request_without_one_gets_one_that_routes_and_answer_share() -> None:
    with _client() as client:
        response = client.get("/echo")
    seen = response.json()["seen"]
    assert re.fullmatch(r"[0-9a-f]{32}", seen)
    assert response.headers["x-request-id"] == seen


def test_errors_carry_the_request_id_once() -> None:
    with _client() as client:
        response = client.get("/fail", headers={"X-Request-Id": "r-2"})
        missing = client.get("/nowhere")
    assert response.status_code == 400
    assert response.headers.get_list("x-request-id") == ["r-2"]
    assert missing.status_code == 404
    assert len(missing.headers.get_list("x-request-id")) == 1
