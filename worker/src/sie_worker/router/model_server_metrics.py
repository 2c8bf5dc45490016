"""The pod's model-server series on the slot router's ``/metrics``.

An endpoint picker scrapes the port a pool's Service targets, which is the router's. At each
scrape the router reads the four series (:mod:`sie_worker.model_server_series`) from every
answering slot's worker ``/metrics`` (concurrently) and serves them for the pod: waiting and
running summed, the highest KV cache use, the models joined and ``max_lora`` the devices of
the workers that answered. A worker that does not answer within :data:`READ_TIMEOUT_S`, or
half the scrape timeout Prometheus announces (``X-Prometheus-Scrape-Timeout-Seconds``) if
that is less, is left out of that scrape (logged): a slow worker must not make the router's
own series, which autoscaling reads, miss their scrape. With none answering the pod
reports zeros.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import Protocol

import httpx

from sie_worker.http.poll import metrics_text
from sie_worker.model_server_series import ServerLoad, combine, parse, render

__all__ = ["READ_TIMEOUT_S", "Slot", "pod_series", "read_timeout"]

_log = logging.getLogger("sie_worker.router.model_server_metrics")
READ_TIMEOUT_S = 2.0
_SCRAPE_TIMEOUT_HEADER = "x-prometheus-scrape-timeout-seconds"


class Slot(Protocol):
    @property
    def url(self) -> str: ...
    @property
    def up(self) -> bool: ...


async def pod_series(
    client: httpx.AsyncClient, slots: Iterable[Slot], headers: Mapping[str, str]
) -> bytes:
    """The model-server series of the answering ``slots``' workers, combined, as text;
    ``headers``: the scrape's."""
    urls = [slot.url for slot in slots if slot.up]
    timeout_s = read_timeout(headers)
    loads = await asyncio.gather(*(_load(client, url, timeout_s) for url in urls))
    return render(combine(load for load in loads if load is not None))


def read_timeout(headers: Mapping[str, str]) -> float:
    """:data:`READ_TIMEOUT_S`, or half the scrape's own timeout when that is less."""
    try:
        announced = float(headers.get(_SCRAPE_TIMEOUT_HEADER, "inf"))
    except ValueError:
        announced = float("inf")
    return min(READ_TIMEOUT_S, announced / 2) if announced > 0 else READ_TIMEOUT_S


async def _load(client: httpx.AsyncClient, url: str, timeout_s: float) -> ServerLoad | None:
    text = await metrics_text(client, url, timeout_s, log=_log, what=f"{url} (worker)")
    if text is None:
        return None
    load = parse(text)
    if load is None:
        _log.info("%s: the worker's /metrics lacks the model-server series", url)
    return load
