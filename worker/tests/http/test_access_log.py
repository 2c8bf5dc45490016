"""The worker's access log leaves out successful polls and probes (sie_worker.http.access_log),
read from the records a real uvicorn server writes."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from tests.support.asgi_server import serve

from sie_worker.http.access_log import QUIET_PATHS, PollFilter, quiet_polls


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def access_lines() -> Iterator[list[str]]:
    logger = logging.getLogger("uvicorn.access")
    handler = _Lines()
    logger.addHandler(handler)
    filters = list(logger.filters)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        yield handler.lines
    finally:
        logger.removeHandler(handler)
        logger.filters[:] = filters
        logger.setLevel(level)


def _app() -> Starlette:
    async def ok(request: Request) -> Response:
        return JSONResponse({"ok": True})

    async def not_ready(request: Request) -> Response:
        return JSONResponse({"ready": False}, status_code=503)

    routes = [Route(path, ok, methods=["GET", "POST"]) for path in QUIET_PATHS - {"/readyz"}]
    routes += [
        Route("/readyz", not_ready),
        Route("/v1/chat/completions", ok, methods=["POST"]),
    ]
    return Starlette(routes=routes)


_GETS = ("/v1/models", "/v1/devices", "/healthz", "/metrics", "/readyz")
_OTHERS = [
    "POST /v1/chat/completions HTTP/1.1",
    "POST /v1/models HTTP/1.1",
    "GET /v1/models?verbose=1 HTTP/1.1",
]


async def _calls(url: str) -> None:
    async with httpx.AsyncClient(base_url=url, trust_env=False) as client:
        for path in _GETS:
            await client.get(path)
        await client.post("/v1/chat/completions", json={})
        await client.post("/v1/models", json={})
        await client.get("/v1/models?verbose=1")


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize(
    ("level", "logged"),
    [
        (logging.INFO, ["GET /readyz HTTP/1.1", *_OTHERS]),  # /readyz answers 503 here
        (logging.DEBUG, [*(f"GET {path} HTTP/1.1" for path in _GETS), *_OTHERS]),
    ],
    ids=["info", "debug"],
)
async def test_successful_polls_and_probes_leave_the_access_log_below_debug(
    anyio_backend: str, access_lines: list[str], level: int, logged: list[str]
) -> None:
    quiet_polls(level)
    async with serve(_app(), lifespan="off", own_logging=True) as port:
        await _calls(f"http://127.0.0.1:{port}")
    assert [line.split('"')[1] for line in access_lines] == logged


def test_the_filter_is_installed_once_and_leaves_other_records_alone() -> None:
    logger = logging.getLogger("uvicorn.access")
    filters = list(logger.filters)
    try:
        quiet_polls(logging.WARNING)
        quiet_polls(logging.INFO)
        assert sum(isinstance(f, PollFilter) for f in logger.filters) == 1
    finally:
        logger.filters[:] = filters
    other = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, "plain %s", ("x",), None)
    assert PollFilter().filter(other)
