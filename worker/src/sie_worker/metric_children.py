"""A Prometheus metric's children by label values, each looked up once.

``metric.labels(...)`` takes a lock and builds a key on every call; the relays touch a few
children on every request (in-flight gauges, request counters, duration histograms), so
the worker, the slot router and the gateway keep the children they have seen.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from prometheus_client.metrics import MetricWrapperBase

__all__ = ["Children"]

M = TypeVar("M", bound=MetricWrapperBase)


class Children(Generic[M]):
    """``children(*values)`` is ``metric.labels(*values)``, in the metric's label order."""

    __slots__ = ("_metric", "_seen")

    def __init__(self, metric: M) -> None:
        self._metric = metric
        self._seen: dict[tuple[str, ...], M] = {}

    def __call__(self, *values: str) -> M:
        child = self._seen.get(values)
        if child is None:
            child = self._seen[values] = self._metric.labels(*values)
        return child

    def forget(self, *values: str) -> None:
        """Drop a child the metric has removed (so a new one is made next time)."""
        self._seen.pop(values, None)
