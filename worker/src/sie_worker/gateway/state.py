"""What the gateway knows about each pod: discovered endpoints, polls, its own in-flight count.

Discovery (:mod:`sie_worker.gateway.discovery`) says which pods each pool x bundle has;
each pod's router is then polled in the background (``/v1/models``, ``/v1/devices``,
``/readyz``) every ``poll_interval_s``, and at once after the gateway changed it, so
routing never waits on a round trip. Between polls, what the gateway just dispatched is
applied optimistically (a model sent to a pod is ``loading`` there, ``ready`` once that pod
served it); a poll that started later supersedes it, unless that request is still in
flight and the poll does not show its model loading yet (the rules and the poll loop are
the router's too: :mod:`sie_worker.backends.table`). A pod that refuses a connection, or
misses ``down_after_failures`` polls in a row, leaves rotation and its in-flight requests
are aborted; polling goes on, so it comes back when it answers again. A pod that leaves
its Service (terminating) only stops getting new requests: what it serves finishes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import anyio
import httpx

from sie_worker.backends.answers import poll_backend
from sie_worker.backends.prefix import PrefixIndex
from sie_worker.backends.table import Attempt, Backend, poll_loop
from sie_worker.gateway.metrics import GatewayMetrics
from sie_worker.gateway.pod_poll import PodPoll, pod_poll
from sie_worker.gateway.policy import Decision, GroupView
from sie_worker.gateway.pools import PoolKey, PoolSpec
from sie_worker.gateway.settings import GatewaySettings
from sie_worker.http.poll import PollError
from sie_worker.metric_children import Children

__all__ = ["Endpoint", "Fleet", "Group", "PodAttempt", "PodPoll", "PodState"]

logger = logging.getLogger("sie_worker.gateway")


@dataclass(frozen=True)
class Endpoint:
    """One pod as discovery reports it: its name and its router's base URL."""

    name: str
    url: str


@dataclass(eq=False)
class PodState(Backend):
    """One pod: the shared backend record (``answering``: its last poll succeeded), and the
    :class:`~sie_worker.gateway.policy.PodLike` the policy reads."""

    name: str = field(default="", kw_only=True)
    key: PoolKey = field(kw_only=True)
    slots: int = field(default=1, kw_only=True)
    removed: bool = False  # no longer listed by discovery; finishing what it serves
    # Routable: answering, ready and still listed. A plain attribute (kept by sync()), as
    # the policy reads it for every pod of every decision.
    up: bool = False
    models: dict[str, str] = field(default_factory=dict)
    widths: dict[str, int] = field(default_factory=dict)
    adapters: dict[str, frozenset[str]] = field(default_factory=dict)  # LoRA, served now
    free_run: int = 0
    # Devices of its widest slot: the pools file's slot_width until a poll counts them.
    slot_width: int = 1
    ready_slots: int = 0
    scope: anyio.CancelScope | None = None  # the poller's, while it runs

    @property
    def routable(self) -> bool:
        return self.up

    def sync(self) -> None:
        self.up = self.answering and self.ready and not self.removed

    def apply(self, model: str, served: bool) -> None:
        state = self.models.get(model)
        if served:
            self.models[model] = "ready"
        elif state not in ("ready", "loading"):
            self.models[model] = "loading"
            self.free_run = max(0, self.free_run - self.widths.get(model, 1))


@dataclass
class Group:
    """One pool x bundle: its spec, its pods, and the requests it holds."""

    spec: PoolSpec
    order: int
    pods: dict[str, PodState] = field(default_factory=dict)
    discovered: bool = False  # discovery has answered once (a cluster list may still be due)
    held: int = 0

    def routable(self) -> list[PodState]:
        return [p for p in self.pods.values() if p.routable]

    def view(self) -> GroupView:
        return GroupView(self.spec.key, self.order, list(self.pods.values()))


@dataclass(eq=False)
class PodAttempt(Attempt):
    """One try on one pod (:meth:`Fleet.attempt`): counted by decision reason, in the pool x
    bundle's in-flight gauge and, once answered, by status."""

    fleet: Fleet = field(kw_only=True)
    pod: PodState = field(kw_only=True)
    decision: Decision = field(kw_only=True)
    model: str | None = field(kw_only=True)

    def started(self) -> None:
        key = self.pod.key
        self.fleet.metrics.decisions_of(key.pool, key.bundle, self.decision.reason).inc()
        self.fleet.dispatched(self.pod, self.model, self.decision.reason)

    def answered(self, status: int) -> None:
        self.status = status
        key = self.pod.key
        self.fleet.metrics.requests_of(key.pool, key.bundle, str(status)).inc()

    def ended(self) -> None:
        if self.refused is not None:
            self.fleet.mark_down(self.pod, self.refused)
        self.fleet.finished(self.pod, self.model, served=self.served)


class Fleet:
    """Every pool x bundle's pods, what routing reads of them, and the metrics that mirror it."""

    def __init__(
        self,
        settings: GatewaySettings,
        specs: Sequence[PoolSpec],
        metrics: GatewayMetrics,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.clock = clock
        self.groups: dict[PoolKey, Group] = {
            spec.key: Group(spec, order) for order, spec in enumerate(specs)
        }
        self._changed = asyncio.Event()
        self._spawn: Callable[[PodState], None] | None = None
        self._listed_cache: (
            tuple[frozenset[str], dict[PoolKey, frozenset[str] | None], dict[str, int]] | None
        ) = None
        self._inflight = Children(metrics.inflight)
        # Which pod was sent which prompt prefixes, by (pool key, pod name).
        self.prefixes = PrefixIndex(settings.prefix.index_blocks)

    # -- change notification ---------------------------------------------------------------

    async def changed(self) -> None:
        """Return at the next change of any pod (a poll, endpoints, a request ending)."""
        await self._changed.wait()

    def notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # -- discovery -----------------------------------------------------------------------

    def set_endpoints(self, key: PoolKey, endpoints: Iterable[Endpoint]) -> None:
        """The pods discovery now lists for ``key``; new ones are polled, gone ones retire."""
        group = self.groups[key]
        group.discovered = True
        listed = {e.name: e for e in endpoints}
        for name, pod in list(group.pods.items()):
            endpoint = listed.get(name)
            if endpoint is not None and endpoint.url == pod.url:
                if pod.removed:  # listed again while it still finished requests: revive it
                    pod.removed = False
                    pod.sync()
                    self._start(pod)
                continue
            if not pod.removed:
                logger.info("%s: pod %s (%s) left the pool", key, name, pod.url)
                self.prefixes.forget((key, name))
                pod.removed = True
                pod.sync()
                if pod.scope is not None:
                    pod.scope.cancel()
            if pod.outstanding == 0:
                del group.pods[name]
        for name, endpoint in listed.items():
            if name in group.pods:
                continue
            pod = PodState(
                endpoint.url,
                name=name,
                key=key,
                slots=group.spec.slots,
                slot_width=group.spec.slot_width,
            )
            group.pods[name] = pod
            logger.info("%s: pod %s (%s) joined the pool", key, name, endpoint.url)
            self._start(pod)
        self._lists_changed()
        self._publish(group)
        self.notify()

    def _start(self, pod: PodState) -> None:
        if self._spawn is not None:
            self._spawn(pod)

    async def run_pollers(self, client: httpx.AsyncClient) -> None:
        """Poll every pod, those discovered later included, until cancelled."""
        async with anyio.create_task_group() as tg:

            def spawn(pod: PodState) -> None:
                tg.start_soon(self._poll_loop, pod, client)

            self._spawn = spawn
            for group in self.groups.values():
                for pod in group.pods.values():
                    if not pod.removed:
                        spawn(pod)
            try:
                await anyio.sleep_forever()
            finally:
                self._spawn = None

    # -- routing -------------------------------------------------------------------------

    def views(self, keys: Iterable[PoolKey]) -> list[GroupView]:
        return [self.groups[k].view() for k in keys]

    # What routing reads of every pod's model list, rebuilt only when a list changes (a
    # poll, a pod joining or leaving, a dispatch of a model a pod did not list): every
    # request reads it, and a fleet lists pods x models.

    def known_models(self) -> frozenset[str]:
        """Every model some pod lists."""
        return self._listed()[0]

    def listings(self) -> Mapping[PoolKey, frozenset[str] | None]:
        """Per pool x bundle, the models its answering pods list (None: none answers)."""
        return self._listed()[1]

    def width_of(self, model: str) -> int | None:
        """The widest any pod lists for ``model`` (None: no pod says)."""
        return self._listed()[2].get(model)

    def _listed(
        self,
    ) -> tuple[frozenset[str], dict[PoolKey, frozenset[str] | None], dict[str, int]]:
        if self._listed_cache is None:
            known: set[str] = set()
            listings: dict[PoolKey, frozenset[str] | None] = {}
            widths: dict[str, int] = {}
            for key, group in self.groups.items():
                answering: set[str] = set()
                polled = False
                for pod in group.pods.values():
                    known.update(pod.models)
                    for model, width in pod.widths.items():
                        widths[model] = max(width, widths.get(model, 0))
                    if pod.answering and not pod.removed:
                        polled = True
                        answering.update(pod.models)
                listings[key] = frozenset(answering) if polled else None
            self._listed_cache = (frozenset(known), listings, widths)
        return self._listed_cache

    def _lists_changed(self) -> None:
        self._listed_cache = None

    def attempt(self, pod: PodState, decision: Decision, model: str | None) -> PodAttempt:
        """One try of a request for ``model`` on ``pod``: ``async with`` it around the try."""
        key = pod.key
        headers = (
            (b"x-sie-pool", key.pool.encode()),
            (b"x-sie-bundle", key.bundle.encode()),
            (b"x-sie-pod", pod.name.encode()),
        )
        return PodAttempt(
            pod,
            pod.name,
            f"pod {pod.name}",
            response_headers=(*headers, (b"x-sie-pod-reason", decision.reason.encode())),
            error_headers=tuple((k.decode(), v.decode()) for k, v in headers),
            resume=self.groups[key].spec.resume,
            fleet=self,
            pod=pod,
            decision=decision,
            model=model,
        )

    def dispatched(self, pod: PodState, model: str | None, reason: str) -> None:
        loads = model is not None and pod.models.get(model) != "ready"
        pod.note_dispatch(model, self.clock(), loads=loads)
        self._inflight(pod.key.pool, pod.key.bundle).inc()
        if model is not None and loads:
            if model not in pod.models:
                self._lists_changed()
            pod.apply(model, served=False)

    def finished(self, pod: PodState, model: str | None, *, served: bool) -> None:
        marks = served and model is not None and pod.models.get(model) != "ready"
        pod.note_finish(model, self.clock(), served=marks)
        self._inflight(pod.key.pool, pod.key.bundle).dec()
        if model is not None and marks:
            if model not in pod.models:
                self._lists_changed()
            pod.apply(model, served=True)
            pod.wake.set()
        group = self.groups[pod.key]
        if pod.removed and pod.outstanding == 0 and group.pods.get(pod.name) is pod:
            del group.pods[pod.name]
            self._lists_changed()
        self.notify()

    def mark_down(self, pod: PodState, reason: str) -> None:
        """Take the pod out of rotation and abort its in-flight requests."""
        if pod.take_down(reason):
            self.prefixes.forget((pod.key, pod.name))  # it may come back with an empty cache
            logger.warning(
                "%s: pod %s (%s) out of rotation: %s", pod.key, pod.name, pod.url, reason
            )
        pod.sync()
        self._lists_changed()
        self._publish(self.groups[pod.key])
        self.notify()

    # -- polling -------------------------------------------------------------------------

    def apply_poll(self, pod: PodState, started_at: float, poll: PodPoll) -> None:
        if pod.removed:
            return
        was_answering = pod.answering
        if not pod.accept_poll(started_at, poll.models.get):
            return  # an older poll finished late
        pod.models = dict(poll.models)
        pod.widths = dict(poll.widths)
        pod.adapters = poll.adapters
        pod.free_run = poll.free_run
        pod.slot_width = poll.slot_width or pod.slot_width
        pod.slots = poll.slots or pod.slots
        pod.ready_slots = poll.ready_slots
        for _, model, served in pod.pending:
            pod.apply(model, served)
        if not was_answering:
            logger.info("%s: pod %s (%s) answers", pod.key, pod.name, pod.url)
        pod.ready = poll.ready
        pod.sync()
        self._lists_changed()
        self._publish(self.groups[pod.key])
        self.notify()

    def poll_failed(self, pod: PodState, error: PollError) -> None:
        if pod.note_poll_failure(error, self.settings.down_after_failures):
            self.mark_down(pod, str(error))

    async def _poll_loop(self, pod: PodState, client: httpx.AsyncClient) -> None:
        headers = (
            {"authorization": f"Bearer {self.settings.api_key}"} if self.settings.api_key else {}
        )

        async def poll() -> PodPoll:
            answer = await poll_backend(client, pod.url, headers, self.settings.poll_timeout_s)
            return pod_poll(answer)

        pod.scope = scope = anyio.CancelScope()
        with scope:
            await poll_loop(
                pod,
                poll,
                lambda started, answer: self.apply_poll(pod, started, answer),
                lambda error: self.poll_failed(pod, error),
                interval_s=self.settings.poll_interval_s,
                clock=self.clock,
                until=lambda: pod.removed,
            )

    def _publish(self, group: Group) -> None:
        labels = {"pool": group.spec.pool, "bundle": group.spec.bundle}
        live = [p for p in group.pods.values() if not p.removed]
        self.metrics.pods.labels(**labels, state="discovered").set(len(live))
        self.metrics.pods.labels(**labels, state="up").set(sum(p.answering for p in live))
        self.metrics.pods.labels(**labels, state="ready").set(sum(p.routable for p in live))
