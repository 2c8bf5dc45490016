"""The watch each rank of a group of nodes keeps on the others: their workers' ``/readyz``,
every :data:`~sie_worker.worker.group_peers.PROBE_INTERVAL_S` seconds, until a peer that was
ready is gone (:class:`~sie_worker.worker.group_peers.PeerWatch`); then ``on_lost`` ends
this worker's part of the group. The I/O shell of :mod:`~sie_worker.worker.group_peers`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping

import httpx

from sie_worker.worker.group_peers import LOST_AFTER, PROBE_INTERVAL_S, PeerWatch

__all__ = ["watch_peers"]

OnLost = Callable[[int, str], Awaitable[None]]
_log = logging.getLogger("sie_worker.manager")


async def watch_peers(
    urls: Mapping[int, str],
    on_lost: OnLost,
    *,
    interval: float = PROBE_INTERVAL_S,
    lost_after: int = LOST_AFTER,
    transport: httpx.AsyncBaseTransport | None = None,
) -> None:
    """Probe every peer until one is gone, then await ``on_lost(rank, why)`` and return."""
    watch = PeerWatch(tuple(urls), lost_after)
    # Its own client: the probes must not queue behind engine calls on the worker's pool.
    timeout = max(interval, 1.0)
    async with httpx.AsyncClient(timeout=timeout, trust_env=False, transport=transport) as client:
        while True:
            probes = await asyncio.gather(*(_probe(client, url) for url in urls.values()))
            for (rank, url), (ready, answer) in zip(urls.items(), probes, strict=True):
                if ready and not watch.watched(rank):
                    _log.info("watching rank %d of the group at %s (ready)", rank, url)
                if watch.observe(rank, ready):
                    why = (
                        f"its worker at {url} was ready, then {answer} {lost_after} times in a row"
                    )
                    await on_lost(rank, why)
                    return
            await asyncio.sleep(interval)


async def _probe(client: httpx.AsyncClient, url: str) -> tuple[bool, str]:
    """``(ready, what it answered)`` of one peer's ``/readyz``."""
    try:
        answer = await client.get(f"{url}/readyz")
    except httpx.HTTPError as exc:
        return False, f"did not answer /readyz ({type(exc).__name__})"
    return answer.status_code == 200, f"answered /readyz {answer.status_code}"
