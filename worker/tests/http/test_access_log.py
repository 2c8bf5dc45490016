"""The worker's access log leaves out successful polls and probes (sie_worker.http.access_log),
read from the records a real uvicorn server writes."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import anyio
import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sie_worker.http.access_log import QUIET_PATHS, PollFilter, quiet_polls
from sie_worker.http.poll import POLLED_PATHS


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


@asynccontextmanager
async def _serve() -> AsyncIterator[str]:
    server = uvicorn.Server(
        uvicorn.Config(_app(), host="127.0.0.1", port=0, log_config=None, ws="none")
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve)
        with anyio.fail_after(10):
            while not server.started:  # noqa: ASYNC110 - uvicorn offers no started event
                await anyio.sleep(0.01)
        try:
            yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
        finally:
            server.should_exit = True


async def _calls(url: str) -> None:
    async with httpx.AsyncClient(base_url=url, trust_env=False) as client:
        for path in ("/v1/models", "/v1/devices", "/healthz", "/metrics", "/readyz"):
            await client.get(path)
        await client.post("/v1/chat/completions", json={})
        await client.post("/v1/models", json={})
        await client.get("/v1/models?verbose=1")


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_successful_polls_and_probes_leave_the_access_log_and_the_rest_stays(
    anyio_backend: str, access_lines: list[str]
) -> None:
    quiet_polls(logging.INFO)
    async with _serve() as url:
        await _calls(url)
    requests = [line.split('"')[1] for line in access_lines]
    assert requests == [
        "GET /readyz HTTP/1.1",  # answered 503: a failure stays
        "POST /v1/chat/completions HTTP/1.1",
        "POST /v1/models HTTP/1.1",
        "GET /v1/models?verbose=1 HTTP/1.1",
    ]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_at_debug_the_access_log_keeps_every_request(
    anyio_backend: str, access_lines: list[str]
) -> None:
    quiet_polls(logging.DEBUG)
    async with _serve() as url:
        await _calls(url)
    assert len(access_lines) == 8


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


def test_what_a_poll_fetches_is_left_out() -> None:
    assert set(POLLED_PATHS) <= QUIET_PATHS
