"""Which pods each pool x bundle has: EndpointSlices in a cluster, the pools file locally.

In a cluster the gateway lists and then watches the EndpointSlices of every pool x bundle
Service (label ``kubernetes.io/service-name``) in its namespace, with lightkube and only
get/list/watch on ``endpointslices`` (the chart's Role). A pod counts while its endpoint is
``ready`` (the router's ``/readyz`` probe passes, the pod is not terminating); a Service
with no ready endpoint is a pool at zero replicas. A failed list or a broken watch is
retried (1 s, doubling to 30 s), with a fresh list each time, so no change is missed.

Locally, entries with ``endpoints`` name their pod routers; the file is read again when it
changes, so endpoints can come and go while the gateway runs.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import httpx2
from lightkube import AsyncClient, KubeConfig
from lightkube import operators as op
from lightkube.core.exceptions import ApiError, ConfigError
from lightkube.operators import Operator
from lightkube.resources.discovery_v1 import EndpointSlice

from sie_worker.gateway.pools import PoolKey, PoolsFileError, PoolSpec, read_pools_file
from sie_worker.gateway.state import Endpoint, Fleet

__all__ = [
    "SERVICE_NAME_LABEL",
    "KubeDiscovery",
    "LocalDiscovery",
    "cluster_namespace",
    "local_endpoints",
    "slice_endpoints",
]

logger = logging.getLogger("sie_worker.gateway")

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
_SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
_WATCH_S = 240  # the API server ends each watch after this; the gateway lists anew
_RETRY_MAX_S = 30.0


def local_endpoints(spec: PoolSpec) -> list[Endpoint]:
    """The pods of a local entry, named ``<pool>-<bundle>-<index>``."""
    return [
        Endpoint(f"{spec.pool}-{spec.bundle}-{i}", url)
        for i, url in enumerate(spec.endpoints or ())
    ]


def slice_endpoints(slices: Iterable[Any], default_port: int | None) -> list[Endpoint]:
    """Ready endpoints of one Service's EndpointSlices, named after their pods."""
    found: dict[str, Endpoint] = {}
    for item in slices:
        port = default_port
        for p in item.ports or ():
            if p.name == "http" and p.port:
                port = p.port
        if port is None:
            continue
        for endpoint in item.endpoints or ():
            conditions = endpoint.conditions
            ready = conditions is None or conditions.ready is None or conditions.ready
            terminating = conditions is not None and bool(conditions.terminating)
            if not ready or terminating or not endpoint.addresses:
                continue
            address = endpoint.addresses[0]
            host = f"[{address}]" if ":" in address else address
            ref = endpoint.targetRef
            name = ref.name if ref is not None and ref.name else address
            found[name] = Endpoint(name, f"http://{host}:{port}")
    return [found[name] for name in sorted(found)]


def cluster_namespace(explicit: str | None) -> str | None:
    """``SIE_GATEWAY_NAMESPACE``, else the service account's namespace (in a pod), else None
    (the kubeconfig context's)."""
    if explicit:
        return explicit
    try:
        return _SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or None
    except OSError:
        return None


class LocalDiscovery:
    """Endpoints written in the pools file, re-read when the file changes."""

    def __init__(self, fleet: Fleet, path: Path, specs: Sequence[PoolSpec], interval_s: float):
        self.fleet = fleet
        self.path = path
        self.keys = {s.key for s in specs if s.endpoints is not None}
        self.interval_s = interval_s
        for spec in specs:
            if spec.key in self.keys:
                fleet.set_endpoints(spec.key, local_endpoints(spec))

    async def run(self) -> None:
        seen = self._stamp()
        while True:
            await anyio.sleep(self.interval_s)
            stamp = self._stamp()
            if stamp == seen:
                continue
            seen = stamp
            try:
                specs = read_pools_file(self.path)
            except PoolsFileError as exc:
                logger.warning("pools file changed but cannot be used; keeping the last: %s", exc)
                continue
            for spec in specs:
                if spec.key in self.keys and spec.endpoints is not None:
                    self.fleet.set_endpoints(spec.key, local_endpoints(spec))

    def _stamp(self) -> tuple[int, int] | None:
        try:
            stat = os.stat(self.path)
        except OSError:
            return None
        return (stat.st_mtime_ns, stat.st_size)


class KubeDiscovery:
    """The EndpointSlices of every pool x bundle Service, listed, then watched."""

    def __init__(
        self,
        fleet: Fleet,
        specs: Sequence[PoolSpec],
        namespace: str | None,
        *,
        config: KubeConfig | None = None,
    ) -> None:
        self.fleet = fleet
        self.services: dict[str, PoolKey] = {
            s.service: s.key for s in specs if s.service is not None and s.endpoints is None
        }
        self.ports: dict[str, int | None] = {s.service: s.port for s in specs if s.service}
        self.namespace = namespace
        self.config = config
        self.last_error: str | None = None

    async def run(self, client: AsyncClient) -> None:
        """List and watch until cancelled, with ``client`` (from :meth:`client`)."""
        if not self.services:
            return
        delay = 1.0
        while True:
            try:
                await self._list_and_watch(client)
                delay = 1.0
            except (ApiError, httpx2.HTTPError, OSError) as exc:
                self.last_error = _describe(exc)
                logger.warning(
                    "EndpointSlices of %s: %s; retrying in %.0f s",
                    ", ".join(sorted(self.services)),
                    self.last_error,
                    delay,
                )
                await anyio.sleep(delay)
                delay = min(delay * 2, _RETRY_MAX_S)

    def client(self) -> AsyncClient:
        """A client from the in-cluster service account, else ``KUBECONFIG``."""
        try:
            config = self.config or KubeConfig.from_env()
        except ConfigError as exc:
            raise RuntimeError(
                "the pools file names Services, but no Kubernetes credentials were found (no "
                f"service account token, no KUBECONFIG): {exc}; run the gateway in the "
                "cluster, or list the pods under `endpoints` for a local run"
            ) from exc
        return AsyncClient(config=config, namespace=self.namespace, trust_env=False)

    async def _list_and_watch(self, client: AsyncClient) -> None:
        labels: dict[str, str | Operator[Any] | Iterable[Any] | None] = {
            SERVICE_NAME_LABEL: op.in_(self.services)
        }
        namespace = self.namespace or client.namespace
        listing = client.list(EndpointSlice, namespace=namespace, labels=labels)
        slices: dict[str, Any] = {}
        async for item in listing:
            slices[_name(item)] = item
        self.last_error = None
        self._apply(slices)
        with anyio.move_on_after(_WATCH_S + 30):
            watch = client.watch(
                EndpointSlice,
                namespace=namespace,
                labels=labels,
                resource_version=listing.resourceVersion,
                server_timeout=_WATCH_S,
            )
            async for event, item in watch:
                if event == "DELETED":
                    slices.pop(_name(item), None)
                else:
                    slices[_name(item)] = item
                self._apply(slices)

    def _apply(self, slices: Mapping[str, Any]) -> None:
        by_service: dict[str, list[Any]] = {service: [] for service in self.services}
        for item in slices.values():
            service = (item.metadata.labels or {}).get(SERVICE_NAME_LABEL)
            if service in by_service:
                by_service[service].append(item)
        for service, items in by_service.items():
            endpoints = slice_endpoints(items, self.ports.get(service))
            key = self.services[service]
            current = {
                (p.name, p.url) for p in self.fleet.groups[key].pods.values() if not p.removed
            }
            if (
                current != {(e.name, e.url) for e in endpoints}
                or not self.fleet.groups[key].discovered
            ):
                self.fleet.set_endpoints(key, endpoints)


def _name(item: EndpointSlice) -> str:
    return item.metadata.name if item.metadata and item.metadata.name else ""


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ApiError):
        status = exc.status
        return f"the API server answered {status.code}: {status.message}"
    return f"{type(exc).__name__}: {exc}"
