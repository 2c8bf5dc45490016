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
from collections.abc import Hashable
from typing import Any

import httpx
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sie_worker.errors import (
    EngineUnavailable,
    MethodNotAllowed,
    NotFound,
    UnknownModel,
)
from sie_worker.gateway.choice import selection
from sie_worker.gateway.health import cluster_health, merge_model_lists
from sie_worker.gateway.policy import Decision
from sie_worker.gateway.pools import PoolKey
from sie_worker.gateway.routing import PodDispatch
from sie_worker.gateway.service import Gateway
from sie_worker.gateway.state import PodState
from sie_worker.http.fan_out import Target, ask_all, fan_out
from sie_worker.http.headers import forward_headers
from sie_worker.http.relay import Dispatch, RelayResponse, Upstream
from sie_worker.http.request import json_object, read_payload

__all__ = [
    "ROUTES",
    "configs",
    "health",
    "healthz",
    "list_devices",
    "list_models",
    "metrics",
    "model_call",
    "native",
    "openai",
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
    answers = await _ask_all(gateway, "/v1/models", request)
    return JSONResponse(merge_model_lists(answers, gateway.catalogue.models))


async def list_devices(request: Request) -> Response:
    answers = await _ask_all(_gateway(request), "/v1/devices", request)
    devices = [
        {**labels, **d}
        for labels, body in answers
        for d in (body.get("devices") or [] if isinstance(body, dict) else [])
        if isinstance(d, dict)
    ]
    return JSONResponse({"devices": devices})


async def model_call(request: Request) -> Response:
    gateway = _gateway(request)
    catalogue = gateway.catalogue
    rest: str = request.path_params["rest"]
    if request.method == "GET":
        model = gateway.model_id(rest)
        merged = merge_model_lists(await _ask_all(gateway, "/v1/models", request), ())
        for entry in merged["data"]:
            if entry.get("id") == model:
                sie: dict[str, Any] = next(
                    (m for m in merged["models"] if m.get("name") == model), {}
                )
                return JSONResponse({**sie, **entry})
        if model in catalogue.models:
            return JSONResponse(merge_model_lists([], [model])["data"][0])
        raise UnknownModel(f"model {rest!r} is not configured in any pool")
    model, _, action = rest.rpartition("/")
    if action not in ("load", "unload", "pin", "unpin") or not model:
        raise NotFound(f"POST /v1/models/{rest}: use /v1/models/<id>/{{load,unload,pin,unpin}}")
    model = gateway.model_id(model)
    body = await request.body()  # its size limit: RequestLimits
    if action in ("load", "pin"):
        return _route(gateway, request, body, model, None)
    return await _fan_out_to_holders(gateway, request, body, model)


# -- requests that name a model --------------------------------------------------------


async def openai(request: Request) -> Response:
    gateway = _gateway(request)
    body = await request.body()  # its size limit: RequestLimits
    payload = read_payload(body)
    model: str = payload["model"]
    # A LoRA adapter's request (model:adapter) goes where its base model is.
    model = gateway.catalogue.base_of(gateway.model_id(model), gateway.fleet.known_models())
    return _route(gateway, request, body, model, payload)


async def native(request: Request) -> Response:
    gateway = _gateway(request)
    raw: str = request.path_params["model"]
    kind = request.scope["path"].split("/")[2]
    body = await request.body()  # its size limit: RequestLimits
    content_type = request.headers.get("content-type", "")
    payload = json_object(body) if "json" in content_type else None
    model = gateway.model_id(raw, generate=kind == "generate")
    return _route(gateway, request, body, model, payload)


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
    upstream = _upstream(request, b"", None)

    async def route(exclude: frozenset[Hashable], hold: bool) -> Dispatch:
        if pod.name in exclude:
            raise EngineUnavailable(f"pod {pod.name} ({pod.url}) is not answering")
        return PodDispatch.of(
            gateway.fleet, pod, Decision(pod.key, pod.name, "least_outstanding"), None
        )

    return RelayResponse(upstream, route, gateway.limits)


ROUTES = [
    # The hot routes first: Starlette tries routes in order, and these paths are exact.
    *[Route(p, openai, methods=["POST"]) for p in _OPENAI_PATHS],
    Route("/healthz", healthz, methods=["GET"]),
    Route("/readyz", readyz, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
    Route("/health", health, methods=["GET"]),
    Route("/v1/models", list_models, methods=["GET"]),
    Route("/v1/devices", list_devices, methods=["GET"]),
    Route("/v1/models/{rest:path}", model_call, methods=["GET", "POST"]),
    *[Route(f"/v1/{kind}/{{model:path}}", native, methods=["POST"]) for kind in _NATIVE],
    Route("/v1/configs", configs, methods=["GET", "PUT", "DELETE"]),
    Route("/v1/configs/{rest:path}", configs, methods=["GET", "PUT", "DELETE"]),
]


# -- helpers ---------------------------------------------------------------------------


def _route(
    gateway: Gateway, request: Request, body: bytes, model: str, payload: dict[str, Any] | None
) -> Response:
    """Relay a request for ``model`` to the pod the gateway picks (holding, retrying)."""
    chosen = selection(
        gateway.specs, gateway.catalogue, gateway.fleet, model, request.headers, payload
    )
    upstream = _upstream(request, body, model)
    picked: list[PoolKey] = []

    async def route(exclude: frozenset[Hashable], hold: bool) -> Dispatch:
        pod, decision = await gateway.holder.pick(chosen, exclude, hold)
        picked.append(pod.key)
        return PodDispatch.of(gateway.fleet, pod, decision, model)

    def done(seconds: float) -> None:
        key = picked[-1] if picked else chosen.groups[0]
        gateway.gauges.duration_of(key.pool, key.bundle).observe(seconds)

    return RelayResponse(upstream, route, gateway.limits, on_done=done, arrived=time.monotonic())


def _upstream(request: Request, body: bytes, model: str | None) -> Upstream:
    headers = forward_headers(request.scope["headers"])  # X-Request-Id: see RequestId
    raw_path: bytes = request.scope.get("raw_path") or request.scope["path"].encode()
    target = raw_path.decode("latin-1").split("?", 1)[0]
    query = request.scope.get("query_string", b"").decode("latin-1")
    return Upstream(
        method=request.method,
        target=f"{target}?{query}" if query else target,
        headers=headers,
        body=body,
        model=model,
    )


def _target(pod: PodState) -> Target:
    return Target(f"pod {pod.name}", pod.name, pod.url, pod.wake.set)


async def _ask_all(
    gateway: Gateway, path: str, request: Request
) -> list[tuple[dict[str, str], Any]]:
    """GET ``path`` from every ready pod at once; pods that fail are left out."""
    headers = {
        k: v for k, v in forward_headers(request.scope["headers"]) if k.lower() == "authorization"
    }
    pods = sorted(
        (p for g in gateway.fleet.groups.values() for p in g.routable()),
        key=lambda p: (p.key.pool, p.key.bundle, p.name),
    )
    keys = {p.name: p.key for p in pods}
    answers = await ask_all(
        gateway.client, [_target(p) for p in pods], path, headers, gateway.settings.poll_timeout_s
    )
    return [
        ({"pool": keys[t.label].pool, "bundle": keys[t.label].bundle, "pod": t.label}, body)
        for t, body in answers
    ]


async def _fan_out_to_holders(
    gateway: Gateway, request: Request, body: bytes, model: str
) -> Response:
    """unload / unpin on every ready pod that has the model (in the pools allowed)."""
    chosen = selection(
        gateway.specs, gateway.catalogue, gateway.fleet, model, request.headers, None
    )
    holders = sorted(
        (
            p
            for k in chosen.groups
            for p in gateway.fleet.groups[k].routable()
            if p.models.get(model, "unloaded") != "unloaded"
        ),
        key=lambda p: p.name,
    )
    if not holders:
        return JSONResponse({"id": model, "state": "unloaded", "pods": []})
    settings = gateway.settings
    limits = httpx.Timeout(settings.read_timeout_s, connect=settings.connect_timeout_s)
    targets = [_target(p) for p in holders]
    upstream = _upstream(request, body, model)
    return await fan_out(gateway.client, upstream, targets, header="x-sie-pod", limits=limits)
