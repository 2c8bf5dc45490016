"""The engines' own metrics, passed through on the worker's ``/metrics``.

SGLang exports its saturation signals on its ``/metrics`` (started with ``--enable-metrics``):
``sglang:num_queue_reqs`` (waiting requests), ``sglang:num_running_reqs``,
``sglang:token_usage`` (KV cache use), ``sglang:gen_throughput``, its own latency histograms;
vLLM the like (``vllm:num_requests_waiting``, ...). An engine listens on 127.0.0.1 only, so
Prometheus cannot scrape it: at each scrape the worker asks every ready engine that exports
metrics for them (concurrently, each within :data:`SCRAPE_TIMEOUT_S`), adds the label
``model`` (the served model's id, as the worker's own series carry it) to every sample,
merges the families of all engines (the text format allows one family block per name) and
appends them to its own. An engine that does not
answer in time, or answers garbage, is left out of that scrape (logged); families named
like the worker's own (``sie_``) are dropped, so they cannot shadow them.

The same scrape reads each engine's load (:func:`engine_load`): its queue, running batch and
KV cache use under the names its family declares (:attr:`EngineFamily.load_series`, the
one list of those names), for the worker's model-server series
(:mod:`sie_worker.model_server_series`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import httpx
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from sie_worker.engines.registry import FAMILIES, LoadSeries
from sie_worker.http.poll import metrics_text
from sie_worker.model_server_series import ServerLoad, ratio

__all__ = ["SCRAPE_TIMEOUT_S", "EngineScrape", "engine_load", "engine_metrics", "merge_families"]

_log = logging.getLogger("sie_worker.engine_metrics")
SCRAPE_TIMEOUT_S = 2.0
_OWN_PREFIX = "sie_"
_LOAD_SERIES: tuple[LoadSeries, ...] = tuple(
    f.load_series for f in FAMILIES.values() if f.load_series is not None
)


@dataclass(frozen=True)
class EngineScrape:
    """One scrape of the engines: their families (``text``) and each one's load, by model
    (an engine that did not answer, or exports no load series, is absent)."""

    text: bytes
    loads: Mapping[str, ServerLoad]


async def engine_metrics(
    client: httpx.AsyncClient,
    engines: Sequence[tuple[str, str]],
    *,
    timeout_s: float = SCRAPE_TIMEOUT_S,
) -> EngineScrape:
    """The metrics of ``engines`` (``(model id, base URL)`` pairs), labelled by model, in the
    text format (empty when there are none), and their loads."""
    if not engines:
        return EngineScrape(b"", {})
    texts = await asyncio.gather(*(_fetch(client, m, url, timeout_s) for m, url in engines))
    parsed = _parse((m, t) for (m, _), t in zip(engines, texts, strict=True) if t)
    loads = {model: load for model, fs in parsed if (load := engine_load(fs)) is not None}
    return EngineScrape(_merge(parsed), loads)


def engine_load(families: Iterable[Metric]) -> ServerLoad | None:
    """One engine's queue and running batch (summed over its samples: one per data-parallel
    rank) and KV cache use (the highest), under the first family's names it exports."""
    by_name = {f.name: f for f in families}
    for names in _LOAD_SERIES:
        found = [by_name.get(n) for n in (names.waiting, names.running, names.kv_usage)]
        if any(f is not None for f in found):
            waiting, running, kv = (
                [s.value for s in f.samples if s.name == f.name] if f else [] for f in found
            )
            kv_usage = max(map(ratio, kv), default=0.0)
            return ServerLoad(waiting=sum(waiting), running=sum(running), kv_usage=kv_usage)
    return None


def merge_families(texts: Iterable[tuple[str, str]]) -> bytes:
    """One exposition of every ``(model, text)``'s families, ``model`` added to each sample."""
    return _merge(_parse(texts))


def _parse(texts: Iterable[tuple[str, str]]) -> list[tuple[str, list[Metric]]]:
    """Each engine's families; an engine whose text does not parse is left out (logged)."""
    parsed = []
    for model, text in texts:
        try:
            parsed.append((model, list(text_string_to_metric_families(text))))
        except ValueError as exc:
            _log.warning("%s: the engine's /metrics is not Prometheus text: %s", model, exc)
    return parsed


def _merge(parsed: Iterable[tuple[str, list[Metric]]]) -> bytes:
    families: dict[str, Metric] = {}
    for model, engine_families in parsed:
        for family in engine_families:
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
    return await metrics_text(client, url, timeout_s, log=_log, what=f"{model} (engine)")
