"""Prometheus collectors of the slot router, in a registry of its own (one per app).

The chart's KEDA triggers read these names; keep them stable:
``sie_router_slots``, ``sie_router_inflight_requests{slot}``, ``sie_router_queued_requests``,
``sie_router_decisions_total{reason}``, ``sie_router_slot_up{slot}``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from sie_worker.http.resume import REASONS as RESUME_REASONS
from sie_worker.metric_children import Children
from sie_worker.model_states import MODEL_STATES
from sie_worker.router.policy import REASONS

__all__ = ["RouterMetrics"]


class RouterMetrics:
    def __init__(self, slot_count: int) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.slots = Gauge(
            "sie_router_slots", "Serving slots of this pod (SIE_GPU_COUNT).", registry=r
        )
        self.inflight = Gauge(
            "sie_router_inflight_requests",
            "Requests sent to a slot and not yet finished.",
            ["slot"],
            registry=r,
        )
        self.queued = Gauge(
            "sie_router_queued_requests",
            "Requests waiting for a slot to answer or for their model to load.",
            registry=r,
        )
        self.decisions = Counter(
            "sie_router_decisions",
            "Routing decisions by reason.",
            ["reason"],
            registry=r,
        )
        self.slot_up = Gauge(
            "sie_router_slot_up", "1 while the slot's worker answers polls.", ["slot"], registry=r
        )
        self.slot_ready = Gauge(
            "sie_router_slot_ready",
            "1 while the slot's worker reports /readyz 200.",
            ["slot"],
            registry=r,
        )
        self.models = Gauge(
            "sie_router_models",
            "Models on answering slots by state (a model counts once per slot).",
            ["state"],
            registry=r,
        )
        self.requests = Counter(
            "sie_router_requests",
            "Requests relayed to slots, by slot and response status.",
            ["slot", "status"],
            registry=r,
        )
        self.duration = Histogram(
            "sie_router_request_duration_seconds",
            "Time from a request's arrival to the end of its relayed response.",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900),
            registry=r,
        )
        self.resumes = Counter(
            "sie_router_resumes",
            "Streams resumed on another slot after theirs failed mid-stream, by reason.",
            ["reason"],
            registry=r,
        )
        self.slots.set(slot_count)
        # Children looked up once: labels() takes a lock and builds a key on every call,
        # and every relayed request touches these.
        self.inflight_of = [self.inflight.labels(slot=str(s)) for s in range(slot_count)]
        self._decisions = Children(self.decisions)
        self._requests = Children(self.requests)  # (slot, status)
        self._resumes = Children(self.resumes)
        for reason in REASONS:
            self._decisions(reason)
        for resume_reason in RESUME_REASONS:
            self._resumes(resume_reason)
        for slot in range(slot_count):
            self.inflight_of[slot].set(0)
            self.slot_up.labels(slot=str(slot)).set(0)
            self.slot_ready.labels(slot=str(slot)).set(0)
        for state in MODEL_STATES:
            self.models.labels(state=state).set(0)

    def decisions_of(self, reason: str) -> Counter:
        """``sie_router_decisions_total{reason}`` (the child, looked up once)."""
        return self._decisions(reason)

    def resumed(self, reason: str) -> None:
        """One more ``sie_router_resumes_total{reason}``."""
        self._resumes(reason).inc()

    def requests_of(self, slot: int, status: int) -> Counter:
        """``sie_router_requests{slot, status}`` (the child, looked up once)."""
        return self._requests(str(slot), str(status))
