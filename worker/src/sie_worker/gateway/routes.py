"""The gateway's endpoints: what each route reads of a request and where it sends it.

Requests that name a model (OpenAI routes by the body's ``model``; SIE-native
``/v1/encode|score|extract|generate/{model}`` by the path, generate with ``__`` for ``/``)
go to the pools that may serve it (:mod:`sie_worker.gateway.choice`), held while none has a
ready pod, then to one pod (:mod:`sie_worker.gateway.routing`), relayed through
:mod:`sie_worker.http.relay` (streams included). ``unload`` / ``unpin`` go to every pod
holding the model (:mod:`sie_worker.http.fan_out`). ``/health`` is cluster health in SIE's
shape, ``/v1/models`` and ``/v1/devices`` the union over the pods.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sie_worker.backends.hop import OwnCalls
from sie_worker.backends.model_calls import model_call
from sie_worker.backends.routed import RoutedRequest, read_routed, request_target
from sie_worker.errors import (
    EngineUnavailable,
    MethodNotAllowed,
    UnknownModel,
)
from sie_worker.gateway.choice import selection
from sie_worker.gateway.health import cluster_health, merge_model_lists
from sie_worker.gateway.routing import OnePod, PodChoice
from sie_worker.gateway.service import Gateway
from sie_worker.gateway.state import PodState
from sie_worker.http.fan_out import Target
from sie_worker.http.headers import forward_headers
from sie_worker.http.relay import RelayResponse

__all__ = [
    "ROUTES",
    "GatewayModelCalls",
    "configs",
    "health",
    "healthz",
    "inference",
    "list_devices",
    "list_models",
    "metrics",
    "model_calls",
    "readyz",
]

_OPENAI_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")
_NATIVE = ("encode", "score", "extract", "generate")


def _gateway(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway


# -- probes, metrics, health -----------------------------------------------------------


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    gateway = _gateway(request)
    pools = [
        {
            "pool": g.spec.pool,
            "bundle": g.spec.bundle,
            "discovered": g.discovered,
            "ready_pods": len(g.routable()),
        }
        for g in gateway.fleet.groups.values()
    ]
    draining = gateway.holder.draining
    ready = not draining and all(p["discovered"] for p in pools)
    body: dict[str, Any] = {
        "status": "ready" if ready else "draining" if draining else "not_ready",
        "pools": pools,
    }
    if gateway.kube is not None and gateway.kube.last_error:
        body["discovery_error"] = gateway.kube.last_error
    return JSONResponse(body, status_code=200 if ready else 503)


async def metrics(request: Request) -> Response:
    data = generate_latest(_gateway(request).gauges.registry)
    return Response(data, headers={"content-type": CONTENT_TYPE_LATEST})


async def health(request: Request) -> Response:
    return JSONResponse(cluster_health(_gateway(request).fleet.groups.values()))


# -- merged views ----------------------------------------------------------------------


async def list_models(request: Request) -> Response:
    gateway = _gateway(request)
    answers = await _answers_by_pod(gateway, "/v1/models", request)
    return JSONResponse(merge_model_lists(answers, gateway.catalogue.models))


async def list_devices(request: Request) -> Response:
    answers = await _answers_by_pod(_gateway(request), "/v1/devices", request)
    devices = [
        {**labels, **d}
        for labels, body in answers
        for d in (body.get("devices") or [] if isinstance(body, dict) else [])
        if isinstance(d, dict)
    ]
    return JSONResponse({"devices": devices})


async def model_calls(request: Request) -> Response:
    """The merged view of one model (``GET``), or one of its actions (``POST``: ``load``,
    ``unload``, ``pin``, ``unpin``): ``load`` and ``pin`` where a request would go, the
    others to every pod holding it.

    :func:`sie_worker.backends.model_calls.model_call` with the gateway's part."""
    return await model_call(GatewayModelCalls(_gateway(request)), request)


@dataclass(frozen=True)
class GatewayModelCalls:
    """What the gateway plugs into :func:`~sie_worker.backends.model_calls.model_call`:
    ``load`` and ``pin`` go where a request for the model would; ``unload`` and ``unpin``
    to every ready pod that has the model (in the pools allowed)."""

    gateway: Gateway
    holder_header: str = "x-sie-pod"

    @property
    def calls(self) -> OwnCalls:
        return self.gateway.calls

    def request_target(self, request: Request) -> str:
        return request_target(request)

    async def model_ids(self, request: Request) -> Collection[str]:
        return self.gateway.known_ids()

    async def model_detail(self, model: str, request: Request) -> Response:
        gateway = self.gateway
        model_id = gateway.model_id(model)
        merged = merge_model_lists(await _answers_by_pod(gateway, "/v1/models", request), ())
        for entry in merged["data"]:
            if entry.get("id") == model_id:
                sie: dict[str, Any] = next(
                    (m for m in merged["models"] if m.get("name") == model_id), {}
                )
                return JSONResponse({**sie, **entry})
        if model_id in gateway.catalogue.models:
            return JSONResponse(merge_model_lists([], [model_id])["data"][0])
        raise UnknownModel(f"model {model!r} is not configured in any pool")

    async def send_model_call(
        self, call: RoutedRequest, action: str, request: Request
    ) -> Response | None:
        if action in ("load", "pin"):
            return _route(self.gateway, request, call)
        return None

    def model_holders(self, model: str, action: str, request: Request) -> list[Target]:
        gateway = self.gateway
        named = RoutedRequest(request.method, "", (), b"", model)
        chosen = selection(gateway.specs, gateway.catalogue, gateway.fleet, named, request.headers)
        holders = sorted(
            (
                p
                for k in chosen.groups
                for p in gateway.fleet.groups[k].routable()
                if p.models.get(model, "unloaded") != "unloaded"
            ),
            key=lambda p: p.name,
        )
        return [_target(p) for p in holders]

    def none_holds(self, model: str, action: str, call: RoutedRequest) -> Response:
        return JSONResponse({"id": model, "state": "unloaded", "pods": []})


# -- requests that name a model --------------------------------------------------------


async def inference(request: Request) -> Response:
    # An OpenAI request or an SIE-native one (model in the path): the gateway's one
    # request path, parse (and resolve) -> choose (pools, then a pod, holding) -> relay.
    gateway = _gateway(request)
    routed = await read_routed(request, gateway.known_ids(), gateway.settings.prefix)
    return _route(gateway, request, routed)


async def configs(request: Request) -> Response:
    if request.method != "GET":
        raise MethodNotAllowed(
            f"{request.method} {request.url.path}: the gateway does not change configs; "
            "change the chart's `models` and run helm upgrade",
            headers={"Allow": "GET"},
        )
    gateway = _gateway(request)
    pods = [p for g in gateway.fleet.groups.values() for p in g.routable()]
    if not pods:
        raise EngineUnavailable("no pod is ready to answer the Config API")
    pod = min(pods, key=lambda p: (p.outstanding, p.name))
    return RelayResponse(_upstream(request, b"", None), OnePod(gateway.fleet, pod), gateway.limits)


ROUTES = [
    # The hot routes first: Starlette tries routes in order, and these paths are exact.
    *[Route(p, inference, methods=["POST"]) for p in _OPENAI_PATHS],
    Route("/healthz", healthz, methods=["GET"]),
    Route("/readyz", readyz, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
    Route("/health", health, methods=["GET"]),
    Route("/v1/models", list_models, methods=["GET"]),
    Route("/v1/devices", list_devices, methods=["GET"]),
    Route("/v1/models/{rest:path}", model_calls, methods=["GET", "POST"]),
    *[Route(f"/v1/{kind}/{{model:path}}", inference, methods=["POST"]) for kind in _NATIVE],
    Route("/v1/configs", configs, methods=["GET", "PUT", "DELETE"]),
    Route("/v1/configs/{rest:path}", configs, methods=["GET", "PUT", "DELETE"]),
]


# -- helpers ---------------------------------------------------------------------------


def _route(gateway: Gateway, request: Request, routed: RoutedRequest) -> Response:
    """Relay a request that names a model to the pod the gateway picks (holding, retrying)."""
    chosen = selection(gateway.specs, gateway.catalogue, gateway.fleet, routed, request.headers)
    choice = PodChoice(gateway.holder, chosen, routed.model, gateway.gauges)
    return RelayResponse(
        routed, choice, gateway.limits, on_done=choice.observe, arrived=time.monotonic()
    )


def _upstream(request: Request, body: bytes, model: str | None) -> RoutedRequest:
    """A request routed without reading its body (model calls, configs)."""
    headers = forward_headers(request.scope["headers"])  # X-Request-Id: see FrontDoor
    return RoutedRequest(request.method, request_target(request), headers, body, model)


def _target(pod: PodState) -> Target:
    return Target(f"pod {pod.name}", pod.name, pod.url, pod.wake.set)


async def _answers_by_pod(
    gateway: Gateway, path: str, request: Request
) -> list[tuple[dict[str, str], Any]]:
    """Every ready pod's answer to ``path``, with its pool, bundle and name."""
    pods = sorted(
        (p for g in gateway.fleet.groups.values() for p in g.routable()),
        key=lambda p: (p.key.pool, p.key.bundle, p.name),
    )
    keys = {p.name: p.key for p in pods}
    targets = [_target(p) for p in pods]
    answers = await gateway.calls.ask_all(targets, path, request.scope["headers"])
    return [
        ({"pool": keys[t.label].pool, "bundle": keys[t.label].bundle, "pod": t.label}, body)
        for t, body in answers
    ]
