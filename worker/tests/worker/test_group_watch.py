"""The watch a rank keeps on the other ranks' workers: a peer that was ready and then stops
answering (or answers not ready) ends the group; one that never was ready is not judged."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from sie_worker.worker.group_watch import watch_peers

URLS = {1: "http://rank-1:8080", 2: "http://rank-2:8080"}


def _peers(answers: dict[str, list[int | None]]) -> httpx.MockTransport:
    """Each host answers its list of statuses in turn (None: no connection), then its last."""

    def handle(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/readyz"
        queue = answers[request.url.host]
        status = queue.pop(0) if len(queue) > 1 else queue[0]
        if status is None:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(status, json={})

    return httpx.MockTransport(handle)


def _watch(answers: dict[str, list[int | None]], timeout: float = 5.0) -> list[tuple[int, str]]:
    lost: list[tuple[int, str]] = []

    async def on_lost(rank: int, why: str) -> None:
        lost.append((rank, why))

    async def run() -> None:
        watch = watch_peers(URLS, on_lost, interval=0.001, lost_after=3, transport=_peers(answers))
        await asyncio.wait_for(watch, timeout)

    asyncio.run(run())
    return lost


def test_a_peer_gone_after_being_ready_is_reported_once_with_what_it_answered() -> None:
    lost = _watch({"rank-1": [503, 200, 200, None], "rank-2": [200]})
    assert lost == [
        (
            1,
            "its worker at http://rank-1:8080 was ready, then did not answer /readyz "
            "(ConnectError) 3 times in a row",
        )
    ]


def test_a_peer_answering_not_ready_after_being_ready_is_gone_too() -> None:
    lost = _watch({"rank-1": [200], "rank-2": [200, 503]})
    assert lost == [
        (
            2,
            "its worker at http://rank-2:8080 was ready, then answered /readyz 503 3 times in "
            "a row",
        )
    ]


def test_peers_never_ready_or_always_ready_are_not_reported() -> None:
    answers: dict[str, list[int | None]] = {"rank-1": [None], "rank-2": [200]}
    with pytest.raises(TimeoutError):  # still watching when the test gives up: nobody lost
        _watch(answers, timeout=0.3)
