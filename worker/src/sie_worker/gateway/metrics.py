"""Prometheus collectors of the gateway, per pool x bundle, in a registry of its own.

The chart's KEDA triggers read ``sie_gateway_pending_requests{pool,bundle}`` (activation:
a pool at zero wakes on its first held request) and ``sie_gateway_inflight_requests``;
keep these names stable.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from sie_worker.gateway.policy import REASONS
from sie_worker.gateway.pools import PoolKey
from sie_worker.metric_children import Children

__all__ = ["HOLD_OUTCOMES", "GatewayMetrics"]

HOLD_OUTCOMES = ("served", "provisioning", "queue_full", "drained", "client_gone")
_POD_STATES = ("discovered", "up", "ready")


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
        # Children of the per-request series, looked up once each.
        self.requests_of = Children(self.requests)  # (pool, bundle, code)
        self.decisions_of = Children(self.decisions)  # (pool, bundle, reason)
        self.duration_of = Children(self.duration)  # (pool, bundle)
        for key in keys:
            pool = {"pool": key.pool, "bundle": key.bundle}
            self.inflight.labels(**pool).set(0)
            self.pending.labels(**pool).set(0)
            for reason in REASONS:
                self.decisions.labels(**pool, reason=reason)
            for state in _POD_STATES:
                self.pods.labels(**pool, state=state).set(0)
            for outcome in HOLD_OUTCOMES:
                self.hold_outcomes.labels(**pool, outcome=outcome)
