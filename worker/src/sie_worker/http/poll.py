"""One poll of a worker or a pod's router, as the slot router and the gateway both make it:
``/v1/models``, ``/v1/devices`` and ``/readyz`` fetched together, each failure turned into a
:class:`PollError` (``refused`` when nothing listens). What the answers mean is the
caller's."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import anyio
import httpx

__all__ = ["POLLED_PATHS", "PollError", "metrics_text", "poll_answers"]

# What one poll fetches, in the order of its answers.
POLLED_PATHS = ("/v1/models", "/v1/devices", "/readyz")


class PollError(Exception):
    """An answer to a poll could not be used; ``refused`` when nothing listens."""

    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


async def poll_answers(
    client: httpx.AsyncClient, url: str, headers: Mapping[str, str], timeout_s: float
) -> tuple[httpx.Response, httpx.Response, httpx.Response]:
    """The ``/v1/models`` and ``/v1/devices`` answers (both 200, else :class:`PollError`) and
    the ``/readyz`` answer (any status: it is the readiness)."""
    # /readyz is public (no credentials sent where none are needed).
    paths = tuple((path, {} if path == "/readyz" else dict(headers)) for path in POLLED_PATHS)
    answers: list[httpx.Response | Exception] = [RuntimeError("not polled")] * len(paths)

    async def get(index: int) -> None:
        path, path_headers = paths[index]
        try:
            answers[index] = await client.get(
                f"{url}{path}", headers=path_headers, timeout=timeout_s
            )
        except Exception as exc:  # reported below, after all three have ended
            answers[index] = exc

    # A task group, not asyncio.gather: cancelling the poller (shutdown) then waits for all
    # three requests to end instead of leaving a connect attempt behind.
    async with anyio.create_task_group() as tg:
        for index in range(len(paths)):
            tg.start_soon(get, index)
    for answer in answers:
        if isinstance(answer, httpx.ConnectError):
            raise PollError(f"connection refused at {url}: {answer}", refused=True) from answer
        if isinstance(answer, httpx.HTTPError):
            raise PollError(f"poll of {url} failed: {type(answer).__name__}: {answer}") from answer
        if isinstance(answer, BaseException):
            raise answer
    models, devices, ready = [a for a in answers if isinstance(a, httpx.Response)]
    for response in (models, devices):
        if response.status_code != 200:
            raise PollError(f"{response.request.url} answered {response.status_code}")
    return models, devices, ready


async def metrics_text(
    client: httpx.AsyncClient, url: str, timeout_s: float, *, log: logging.Logger, what: str
) -> str | None:
    """``url``'s ``/metrics`` text, or None (logged at info under ``what``) when it does not
    answer 200 in time: a scrape leaves out what it cannot read rather than failing."""
    try:
        response = await client.get(url + "/metrics", timeout=timeout_s)
    except httpx.HTTPError as exc:
        log.info("%s: metrics not read: %s: %s", what, type(exc).__name__, exc)
        return None
    if response.status_code != 200:
        log.info("%s: metrics not read: HTTP %d", what, response.status_code)
        return None
    return response.text
