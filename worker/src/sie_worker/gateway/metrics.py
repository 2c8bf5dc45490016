"""Prometheus collectors of the gateway, per pool x bundle, in a registry of its own.

The chart's KEDA triggers read ``sie_gateway_pending_requests{pool,bundle}`` (activation:
a pool at zero wakes on its first held request) and ``sie_gateway_inflight_requests``;
keep these names stable.

Every series the chart's alerts and dashboards read exists from the start for each pool x
bundle, at zero, for every value of its other label (the tables below): ``increase()`` over
a series that appears with its first event would miss that event.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from sie_worker.errors import SieError
from sie_worker.gateway.policy import REASONS
from sie_worker.gateway.pools import PoolKey
from sie_worker.http.resume import REASONS as RESUME_REASONS
from sie_worker.metric_children import Children

__all__ = ["ANSWER_CODES", "HOLD_OUTCOMES", "GatewayMetrics", "HeldRequest"]

HOLD_OUTCOMES = ("served", "provisioning", "queue_full", "drained", "client_gone")
_POD_STATES = ("discovered", "up", "ready")


def _error_statuses(cls: type[SieError]) -> set[int]:
    return {cls.status}.union(*(_error_statuses(sub) for sub in cls.__subclasses__()))


# The statuses a client gets for a request routed to a pool: 200 and those of the error
# codes (errors.py), the gateway's own (429 queue_full, 503 provisioning) among them. A
# backend's other status gets its series when it first happens.
ANSWER_CODES = tuple(str(s) for s in sorted({200, *_error_statuses(SieError)} - {SieError.status}))


class HeldRequest:
    """One request held for a pool x bundle, from :meth:`GatewayMetrics.hold` to :meth:`end`."""

    __slots__ = ("_metrics", "key", "since")

    def __init__(self, metrics: GatewayMetrics, key: PoolKey) -> None:
        self._metrics, self.key, self.since = metrics, key, time.monotonic()

    def end(self, outcome: str) -> None:
        """Observe the hold time and how the hold ended (once)."""
        self._metrics.holds[self.key].pop(self, None)
        labels = {"pool": self.key.pool, "bundle": self.key.bundle}
        self._metrics.held.labels(**labels).observe(time.monotonic() - self.since)
        self._metrics.hold_outcomes.labels(**labels, outcome=outcome).inc()


class GatewayMetrics:
    def __init__(self, keys: Iterable[PoolKey]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        labels = ["pool", "bundle"]
        self.requests = Counter(
            "sie_gateway_requests",
            "Requests answered, by pool x bundle and HTTP status (empty pool: none chosen).",
            [*labels, "code"],
            registry=r,
        )
        self.inflight = Gauge(
            "sie_gateway_inflight_requests",
            "Requests relayed to a pod of the pool x bundle and not yet finished.",
            labels,
            registry=r,
        )
        self.pending = Gauge(
            "sie_gateway_pending_requests",
            "Requests held because the pool x bundle has no ready pod (scale from zero).",
            labels,
            registry=r,
        )
        self.held = Histogram(
            "sie_gateway_hold_seconds",
            "How long requests were held waiting for a ready pod.",
            labels,
            buckets=(0.1, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 90, 120, 150),
            registry=r,
        )
        self.hold_outcomes = Counter(
            "sie_gateway_held_requests",
            "Held requests by how their hold ended.",
            [*labels, "outcome"],
            registry=r,
        )
        self.decisions = Counter(
            "sie_gateway_decisions",
            "Routing decisions by pool x bundle and reason.",
            [*labels, "reason"],
            registry=r,
        )
        self.pods = Gauge(
            "sie_gateway_pods",
            "Pods of the pool x bundle: discovered (endpoints), up (answering), ready.",
            [*labels, "state"],
            registry=r,
        )
        self.duration = Histogram(
            "sie_gateway_request_duration_seconds",
            "Time from a request's arrival to the end of its answer.",
            labels,
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900),
            registry=r,
        )
        self.oldest_held = Gauge(
            "sie_gateway_oldest_held_seconds",
            "How long the oldest request held for the pool x bundle has waited (0: none held).",
            labels,
            registry=r,
        )
        self.resumes = Counter(
            "sie_gateway_resumes",
            "Streams resumed on another pod after theirs failed mid-stream, by reason.",
            ["reason"],
            registry=r,
        )
        self._resumes = Children(self.resumes)
        for reason in RESUME_REASONS:
            self._resumes(reason)
        # Requests held per pool x bundle, oldest first (dicts keep insertion order).
        self.holds: dict[PoolKey, dict[HeldRequest, None]] = {}
        # Children of the per-request series, looked up once each.
        self.requests_of = Children(self.requests)  # (pool, bundle, code)
        self.decisions_of = Children(self.decisions)  # (pool, bundle, reason)
        self.duration_of = Children(self.duration)  # (pool, bundle)
        for key in keys:
            pool = {"pool": key.pool, "bundle": key.bundle}
            self.holds[key] = {}
            self.oldest_held.labels(**pool).set_function(self._oldest(key))
            self.held.labels(**pool)
            self.duration.labels(**pool)
            for code in ANSWER_CODES:
                self.requests.labels(**pool, code=code)
            self.inflight.labels(**pool).set(0)
            self.pending.labels(**pool).set(0)
            for reason in REASONS:
                self.decisions.labels(**pool, reason=reason)
            for state in _POD_STATES:
                self.pods.labels(**pool, state=state).set(0)
            for outcome in HOLD_OUTCOMES:
                self.hold_outcomes.labels(**pool, outcome=outcome)

    def resumed(self, reason: str) -> None:
        """One more ``sie_gateway_resumes_total{reason}``."""
        self._resumes(reason).inc()

    def hold(self, key: PoolKey) -> HeldRequest:
        """A request starts waiting for a ready pod of ``key``; call ``end`` when it stops."""
        held = HeldRequest(self, key)
        self.holds.setdefault(key, {})[held] = None
        return held

    def _oldest(self, key: PoolKey) -> Callable[[], float]:
        def oldest() -> float:
            held = next(iter(self.holds.get(key, ())), None)
            return 0.0 if held is None else time.monotonic() - held.since

        return oldest
