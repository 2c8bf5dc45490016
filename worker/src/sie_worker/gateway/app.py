"""The gateway (``sie-worker gateway``): one front door for every pool x bundle.

:func:`create_gateway_app` wires the routes (:mod:`sie_worker.gateway.routes`), the
middleware and the running state (:class:`~sie_worker.gateway.service.Gateway`, whose
lifespan runs discovery and the polls). ``X-Request-Id`` is kept (one is added when the
client sent none).
"""

from __future__ import annotations

import httpx
from starlette.applications import Starlette

from sie_worker.backends.routed import SESSION_FIELDS
from sie_worker.gateway.catalogue import Catalogue
from sie_worker.gateway.discovery import KubeDiscovery
from sie_worker.gateway.pools import PoolSpec
from sie_worker.gateway.routes import ROUTES
from sie_worker.gateway.service import Gateway
from sie_worker.gateway.settings import GatewaySettings
from sie_worker.http.app_shell import app_shell

__all__ = ["SESSION_FIELDS", "Gateway", "create_gateway_app"]


def create_gateway_app(
    settings: GatewaySettings,
    *,
    specs: tuple[PoolSpec, ...] | None = None,
    catalogue: Catalogue | None = None,
    client: httpx.AsyncClient | None = None,
    kube: KubeDiscovery | None = None,
) -> Starlette:
    """The gateway app. Pools come from ``settings.pools_file`` unless ``specs`` is given;
    ``client`` (polls and fan-outs) and ``kube`` (EndpointSlice discovery) are injectable."""
    gateway = Gateway(settings, specs, catalogue, client, kube)
    app = app_shell(ROUTES, settings, gateway.lifespan)
    app.state.gateway = gateway
    return app
