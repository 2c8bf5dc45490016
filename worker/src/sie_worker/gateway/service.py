"""The gateway's running state: its pools and their pods, the requests it holds, its client
for polls and fan-outs, discovery, and the lifespan that runs them (and drains on SIGTERM).

Discovery (:mod:`sie_worker.gateway.discovery`) lists each pool x bundle's pods, from a
local pools file or the cluster's EndpointSlices; :class:`~sie_worker.gateway.state.Fleet`
polls them; :class:`~sie_worker.gateway.routing.Holder` holds requests while a pool has no
ready pod. The routes (:mod:`sie_worker.gateway.routes`) read all of it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from functools import partial

import anyio
import httpx
from starlette.applications import Starlette

from sie_worker.backends.hop import OwnCalls
from sie_worker.gateway.catalogue import Catalogue
from sie_worker.gateway.discovery import KubeDiscovery, LocalDiscovery, cluster_namespace
from sie_worker.gateway.metrics import GatewayMetrics
from sie_worker.gateway.pools import PoolSpec, read_pools_file
from sie_worker.gateway.routing import Holder
from sie_worker.gateway.settings import GatewaySettings
from sie_worker.gateway.state import Fleet
from sie_worker.http.relay import RelayLimits
from sie_worker.http.transport import hop_client
from sie_worker.sie_api.ids import AnyOf, served_or_asked

__all__ = ["Gateway"]

logger = logging.getLogger("sie_worker.gateway")


class Gateway:
    """One gateway's pools, pods, held requests and background work."""

    def __init__(
        self,
        settings: GatewaySettings,
        specs: tuple[PoolSpec, ...] | None,
        catalogue: Catalogue | None,
        client: httpx.AsyncClient | None,
        kube: KubeDiscovery | None,
    ) -> None:
        self.settings = settings
        self.specs = specs if specs is not None else read_pools_file(settings.pools_file)
        if catalogue is None and settings.config_dir is not None:
            catalogue, problems = Catalogue.from_config_dir(settings.config_dir)
            for problem in problems:
                logger.warning("model config left out of routing: %s", problem)
        self.catalogue = catalogue or Catalogue.empty()
        self.gauges = GatewayMetrics(s.key for s in self.specs)
        self.fleet = Fleet(settings, self.specs, self.gauges)
        self.holder = Holder(self.fleet, slot_target=settings.slot_target)
        self.limits = RelayLimits(
            settings.connect_timeout_s,
            settings.read_timeout_s,
            resume_max=settings.resume_max,
            on_resume=self.gauges.resumed,
        )
        self.calls = OwnCalls(client, partial(_build_client, settings), "gateway", settings)
        self.kube = kube
        self.local: LocalDiscovery | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def client(self) -> httpx.AsyncClient:
        return self.calls.client

    def known_ids(self) -> AnyOf:
        """The model ids this gateway knows: the shipped configs' and what its pods list."""
        return AnyOf(self.catalogue.models, self.fleet.known_models())

    def model_id(self, asked: str, *, generate: bool = False) -> str:
        """The model a request names, by the one model-id rule (:mod:`sie_worker.sie_api.ids`);
        unknown: as asked, for :func:`~.choice.select_pools` to refuse or the pods to answer."""
        return served_or_asked(asked, self.known_ids(), generate=generate)

    def drain(self) -> None:
        """Answer held requests at once (503 provisioning) and report not ready."""
        if not self.holder.draining:
            logger.info("draining: held requests are answered with provisioning")
        self.holder.drain()

    def request_drain(self) -> None:
        """:meth:`drain`, safe to call from a signal handler."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.drain)

    @asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self._loop = asyncio.get_running_loop()
        kube = self.kube
        if kube is None and any(s.endpoints is None for s in self.specs):
            kube = KubeDiscovery(self.fleet, self.specs, cluster_namespace(self.settings.namespace))
        kube_client = kube.client() if kube is not None else None  # fails at start, not later
        if any(s.endpoints is not None for s in self.specs):
            self.local = LocalDiscovery(
                self.fleet, self.settings.pools_file, self.specs, self.settings.reload_interval_s
            )
        self.kube = kube
        async with self.calls.running() as (client, connections):
            # Idle connections to the pods' routers, for this run of the app.
            self.limits = replace(self.limits, connections=connections)
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.fleet.run_pollers, client)
                if self.local is not None:
                    tg.start_soon(self.local.run)
                if kube is not None and kube_client is not None:
                    tg.start_soon(kube.run, kube_client)
                try:
                    yield
                finally:
                    self.holder.drain()
                    tg.cancel_scope.cancel()


def _build_client(settings: GatewaySettings) -> httpx.AsyncClient:
    """The client of the gateway's own calls to its pods: polls, fan-outs, merged views."""
    return hop_client(httpx.Timeout(settings.poll_timeout_s))
