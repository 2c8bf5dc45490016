"""The engines' own metrics, passed through on the worker's ``/metrics``.

SGLang exports its saturation signals on its ``/metrics`` (started with ``--enable-metrics``):
``sglang:num_queue_reqs`` (waiting requests), ``sglang:num_running_reqs``,
``sglang:token_usage`` (KV cache use), ``sglang:gen_throughput``, its own latency histograms.
An engine listens on 127.0.0.1 only, so Prometheus cannot scrape it: at each scrape the
worker asks every ready SGLang engine for its metrics (concurrently, each within
:data:`SCRAPE_TIMEOUT_S`), adds the label ``model`` (the served model's id, as the worker's
own series carry it) to every sample, merges the families of all engines (the text format
allows one family block per name) and appends them to its own. An engine that does not
answer in time, or answers garbage, is left out of that scrape (logged); families named
like the worker's own (``sie_``) are dropped, so they cannot shadow them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Iterator, Sequence

import httpx
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["SCRAPE_TIMEOUT_S", "engine_metrics", "merge_families"]

_log = logging.getLogger("sie_worker.engine_metrics")
SCRAPE_TIMEOUT_S = 2.0
_OWN_PREFIX = "sie_"


async def engine_metrics(
    client: httpx.AsyncClient,
    engines: Sequence[tuple[str, str]],
    *,
    timeout_s: float = SCRAPE_TIMEOUT_S,
) -> bytes:
    """The metrics of ``engines`` (``(model id, base URL)`` pairs), labelled by model, in the
    text format; empty when there are none."""
    if not engines:
        return b""
    texts = await asyncio.gather(*(_fetch(client, m, url, timeout_s) for m, url in engines))
    return merge_families((m, t) for (m, _), t in zip(engines, texts, strict=True) if t)


def merge_families(texts: Iterable[tuple[str, str]]) -> bytes:
    """One exposition of every ``(model, text)``'s families, ``model`` added to each sample."""
    families: dict[str, Metric] = {}
    for model, text in texts:
        try:
            parsed = list(text_string_to_metric_families(text))
        except ValueError as exc:
            _log.warning("%s: the engine's /metrics is not Prometheus text: %s", model, exc)
            continue
        for family in parsed:
            if family.name.startswith(_OWN_PREFIX):
                continue
            samples = [s._replace(labels={**s.labels, "model": model}) for s in family.samples]
            merged = families.get(family.name)
            if merged is None:
                family.samples = samples
                families[family.name] = family
            elif merged.type == family.type:
                merged.samples.extend(samples)
    if not families:
        return b""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(families.values())))
    return generate_latest(registry)


class _Families:
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


async def _fetch(client: httpx.AsyncClient, model: str, url: str, timeout_s: float) -> str | None:
    try:
        response = await client.get(url + "/metrics", timeout=timeout_s)
    except httpx.HTTPError as exc:
        _log.info("%s: engine metrics not read: %s: %s", model, type(exc).__name__, exc)
        return None
    if response.status_code != 200:
        _log.info("%s: engine metrics not read: HTTP %d", model, response.status_code)
        return None
    return response.text
