"""From the pools a request may go to (:mod:`sie_worker.gateway.choice`) to a pod: holding
while none has a ready pod; each try is the fleet's attempt on the pod
(:meth:`~sie_worker.gateway.state.Fleet.attempt`).

Holding (:class:`Holder`): when none of those pools has a ready pod, the request waits in
the first of them (counted in ``sie_gateway_pending_requests``) until a pod is ready, for
at most ``SIE_GATEWAY_HOLD_S`` (then 503 ``provisioning`` with Retry-After), and at most
``SIE_GATEWAY_MAX_HELD`` requests per pool x bundle wait (beyond: 429 ``queue_full``). On
drain (SIGTERM) every held request is answered at once with ``provisioning``, so clients
retry against another gateway replica. Every held request is answered exactly once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable
from dataclasses import dataclass

import anyio

from sie_worker.errors import EngineUnavailable, Provisioning, QueueFull
from sie_worker.gateway.choice import Selection
from sie_worker.gateway.metrics import GatewayMetrics, HeldRequest
from sie_worker.gateway.policy import Decision, choose
from sie_worker.gateway.pools import PoolKey
from sie_worker.gateway.state import Fleet, PodAttempt, PodState

__all__ = ["Holder", "OnePod", "PodChoice"]

logger = logging.getLogger("sie_worker.gateway")


class Holder:
    """Routing with holding: returns a pod once one is ready, or raises the refusal."""

    def __init__(self, fleet: Fleet, *, slot_target: int = 4) -> None:
        self.fleet = fleet
        self.settings = fleet.settings
        self.slot_target = slot_target
        self.draining = False

    def drain(self) -> None:
        """Answer every held request now (and every request that would be held)."""
        self.draining = True
        self.fleet.notify()

    async def pick(
        self, selection: Selection, exclude: frozenset[Hashable], hold: bool = True
    ) -> tuple[PodState, Decision]:
        """The pod of a try; ``hold``: wait for one while none is ready (else refuse at
        once, as a resumption must)."""
        fleet, settings = self.fleet, self.settings
        names = frozenset(str(e) for e in exclude)
        held: HeldRequest | None = None
        outcome = "client_gone"
        try:
            while True:
                hits = (
                    fleet.prefixes.hits(selection.prefix)
                    if selection.prefix and selection.session is None
                    else None
                )
                decision = choose(
                    selection.model,
                    selection.width,
                    fleet.views(selection.groups),
                    session=selection.session,
                    exclude=names,
                    slot_target=self.slot_target,
                    prefix=hits.best if hits else None,
                    adapter=selection.adapter,
                )
                if decision is not None:
                    outcome = "served"
                    assert isinstance(decision.group, PoolKey)
                    # The pod chosen holds this prompt's blocks now (for the next turn).
                    fleet.prefixes.record(selection.prefix, (decision.group, decision.pod))
                    return fleet.groups[decision.group].pods[decision.pod], decision
                target = held.key if held else selection.groups[0]
                if not hold:
                    raise EngineUnavailable(f"pool {target} has no other ready pod")
                if self.draining:
                    outcome = "drained"
                    self._count(target, 503)
                    raise Provisioning(
                        f"pool {target} has no ready pod and this gateway is shutting down; "
                        f"retry after {settings.retry_after_s} s",
                        retry_after_s=settings.retry_after_s,
                    )
                if held is None:
                    group = fleet.groups[target]
                    if group.held >= settings.max_held:
                        labels = {"pool": target.pool, "bundle": target.bundle}
                        fleet.metrics.hold_outcomes.labels(**labels, outcome="queue_full").inc()
                        self._count(target, 429)
                        raise QueueFull(
                            f"pool {target} has no ready pod and already holds "
                            f"{settings.max_held} requests waiting for one "
                            "(SIE_GATEWAY_MAX_HELD); retry later"
                        )
                    held = fleet.metrics.hold(target)
                    self._hold(target, +1)
                remaining = held.since + settings.hold_s - time.monotonic()
                if remaining <= 0:
                    outcome = "provisioning"
                    self._count(target, 503)
                    raise Provisioning(
                        f"pool {target} has no ready pod after holding the request for "
                        f"{settings.hold_s:g} s (SIE_GATEWAY_HOLD_S): it is scaling up from "
                        f"zero or its pods are not ready yet; retry after "
                        f"{settings.retry_after_s} s",
                        retry_after_s=settings.retry_after_s,
                    )
                # Nothing awaited since the decision: no change can have been missed.
                with anyio.move_on_after(remaining):
                    await fleet.changed()
        finally:
            if held is not None:
                self._hold(held.key, -1)
                held.end(outcome)

    def _hold(self, key: PoolKey, delta: int) -> None:
        group = self.fleet.groups[key]
        group.held += delta
        self.fleet.metrics.pending.labels(pool=key.pool, bundle=key.bundle).set(group.held)

    def _count(self, key: PoolKey, code: int) -> None:
        self.fleet.metrics.requests.labels(pool=key.pool, bundle=key.bundle, code=str(code)).inc()


@dataclass
class PodChoice:
    """A try's pod, as :mod:`sie_worker.http.relay` asks for it: one of the pools the
    selection allows (:meth:`Holder.pick`, holding while none is ready), accounted as one
    try; :meth:`observe` records the request's time by the pool x bundle that served it."""

    holder: Holder
    selection: Selection
    model: str | None
    gauges: GatewayMetrics
    served_by: PoolKey | None = None

    async def __call__(self, exclude: frozenset[Hashable], hold: bool) -> PodAttempt:
        pod, decision = await self.holder.pick(self.selection, exclude, hold)
        self.served_by = pod.key
        return self.holder.fleet.attempt(pod, decision, self.model)

    def observe(self, seconds: float) -> None:
        key = self.served_by or self.selection.groups[0]
        self.gauges.duration_of(key.pool, key.bundle).observe(seconds)


@dataclass(frozen=True)
class OnePod:
    """A try on one given pod (the Config API's reads), refused once that pod failed."""

    fleet: Fleet
    pod: PodState

    async def __call__(self, exclude: frozenset[Hashable], hold: bool) -> PodAttempt:
        pod = self.pod
        if pod.name in exclude:
            raise EngineUnavailable(f"pod {pod.name} ({pod.url}) is not answering")
        return self.fleet.attempt(pod, Decision(pod.key, pod.name, "least_outstanding"), None)
