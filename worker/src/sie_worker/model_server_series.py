"""What an endpoint picker reads of a model server, for a worker or a whole pod (pure).

The Gateway API Inference Extension's model-server protocol has a picker (llm-d's router, the
reference endpoint picker) scrape each pod's ``/metrics`` for its queue, its running batch,
its KV cache use and the LoRA adapters it holds. A worker serves these four series for all
of its models, and the slot router the same four for its pod, on the port the pool's
Service targets:

- ``sie_worker_requests_waiting``: requests waiting in the engines' queues (summed);
- ``sie_worker_requests_running``: requests the engines are running (summed);
- ``sie_worker_kv_cache_usage_ratio``: 0..1, the highest KV cache use of any engine;
- ``sie_worker_lora_requests_info``: one series, value 1, labels ``running_lora_adapters``
  (the ready models, sorted, comma-separated), ``waiting_lora_adapters`` (the loading ones
  that are ready nowhere) and ``max_lora`` (the devices).

vLLM's own ``vllm:lora_requests_info`` keeps one series per label set and sets the newest to
the current time; a picker takes the series with the highest value. Ours has exactly one
series per scrape, so value 1 reads the same.

:func:`combine` folds the loads of engines into a worker's, or of workers into a pod's;
:func:`render` writes one in the Prometheus text format and :func:`parse` reads it back
from a worker's ``/metrics`` (the router's input). No I/O here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

__all__ = [
    "KV_USAGE",
    "LORA_INFO",
    "LORA_LABELS",
    "RUNNING",
    "SERIES",
    "WAITING",
    "ServerLoad",
    "combine",
    "parse",
    "ratio",
    "render",
]

WAITING = "sie_worker_requests_waiting"
RUNNING = "sie_worker_requests_running"
KV_USAGE = "sie_worker_kv_cache_usage_ratio"
LORA_INFO = "sie_worker_lora_requests_info"
SERIES = (WAITING, RUNNING, KV_USAGE, LORA_INFO)
LORA_LABELS = ("max_lora", "running_lora_adapters", "waiting_lora_adapters")


@dataclass(frozen=True)
class ServerLoad:
    """The load of one engine, one worker or one pod. ``ready`` / ``loading``: model ids."""

    waiting: float = 0.0
    running: float = 0.0
    kv_usage: float = 0.0
    ready: frozenset[str] = field(default_factory=frozenset)
    loading: frozenset[str] = field(default_factory=frozenset)
    max_lora: int = 0


def combine(loads: Iterable[ServerLoad]) -> ServerLoad:
    """Waiting, running and ``max_lora`` summed, the highest KV use, the models joined (a
    model ready anywhere is not waiting)."""
    items = list(loads)
    ready = frozenset().union(*(load.ready for load in items))
    return ServerLoad(
        waiting=sum(load.waiting for load in items),
        running=sum(load.running for load in items),
        kv_usage=max((load.kv_usage for load in items), default=0.0),
        ready=ready,
        loading=frozenset().union(*(load.loading for load in items)) - ready,
        max_lora=sum(load.max_lora for load in items),
    )


def ratio(value: float) -> float:
    """``value`` as a share in 0..1 (an engine's NaN counts as 0)."""
    return 0.0 if math.isnan(value) else min(1.0, max(0.0, value))


def render(load: ServerLoad) -> bytes:
    """The four series of ``load`` in the Prometheus text format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(load))
    return generate_latest(registry)


def parse(text: str) -> ServerLoad | None:
    """The four series as :func:`render` wrote them into ``text`` (a worker's ``/metrics``);
    ``None`` when ``text`` is not Prometheus text or lacks them."""
    try:
        families = {f.name: f for f in text_string_to_metric_families(text) if f.name in SERIES}
    except ValueError:
        return None
    if set(families) != set(SERIES):
        return None

    def value(name: str) -> float:
        return sum(s.value for s in families[name].samples)

    info = families[LORA_INFO].samples
    labels = info[0].labels if info else {}
    try:
        max_lora = int(labels.get("max_lora", "0"))
    except ValueError:
        max_lora = 0
    return ServerLoad(
        waiting=value(WAITING),
        running=value(RUNNING),
        kv_usage=ratio(max((s.value for s in families[KV_USAGE].samples), default=0.0)),
        ready=_names(labels.get("running_lora_adapters", "")),
        loading=_names(labels.get("waiting_lora_adapters", "")),
        max_lora=max_lora,
    )


def _names(joined: str) -> frozenset[str]:
    return frozenset(name for name in joined.split(",") if name)


class _Collector:
    def __init__(self, load: ServerLoad) -> None:
        self._load = load

    def collect(self) -> Iterator[Metric]:
        load = self._load
        yield GaugeMetricFamily(
            WAITING, "Requests waiting in the engines' queues.", value=load.waiting
        )
        yield GaugeMetricFamily(RUNNING, "Requests the engines are running.", value=load.running)
        yield GaugeMetricFamily(
            KV_USAGE, "Highest KV cache use of any engine (0..1).", value=ratio(load.kv_usage)
        )
        info = GaugeMetricFamily(
            LORA_INFO,
            "Models held: running_lora_adapters ready, waiting_lora_adapters loading, "
            "max_lora the devices (value 1).",
            labels=LORA_LABELS,
        )
        info.add_metric(
            [str(load.max_lora), ",".join(sorted(load.ready)), ",".join(sorted(load.loading))], 1
        )
        yield info
