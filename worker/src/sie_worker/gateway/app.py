"""The gateway (``sie-worker gateway``): one front door for every pool x bundle.

Requests that name a model (OpenAI routes by the body's ``model``; SIE-native
``/v1/encode|score|extract|generate/{model}`` by the path, generate with ``__`` for ``/``)
go to the pool x bundles that may serve it (:mod:`sie_worker.gateway.routing`), held while
none has a ready pod, and then to one pod (:mod:`sie_worker.gateway.policy`), relayed
through :mod:`sie_worker.http.relay` (streams included). ``X-Request-Id`` is kept (one is
added when the client sent none). ``/health`` is cluster health in SIE's shape,
``/v1/models`` and ``/v1/devices`` the union over the pods.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Hashable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sie_worker.errors import (
    EngineUnavailable,
    InvalidRequest,
    MethodNotAllowed,
    NotFound,
    SieError,
    UnknownModel,
)
from sie_worker.gateway.catalogue import Catalogue, decode_path_model
from sie_worker.gateway.discovery import KubeDiscovery, LocalDiscovery, cluster_namespace
from sie_worker.gateway.health import cluster_health, merge_model_lists
from sie_worker.gateway.metrics import GatewayMetrics
from sie_worker.gateway.policy import Decision
from sie_worker.gateway.pools import PoolKey, PoolSpec, read_pools_file
from sie_worker.gateway.routing import Holder, PodDispatch, Selection, select_pools
from sie_worker.gateway.settings import GatewaySettings
from sie_worker.gateway.state import Fleet, PodState
from sie_worker.http.auth import BearerAuth
from sie_worker.http.errors import EXCEPTION_HANDLERS, error_response
from sie_worker.http.relay import (
    Dispatch,
    RelayLimits,
    RelayResponse,
    Upstream,
    forward_headers,
)
from sie_worker.http.request import read_body
from sie_worker.http.request_id import RequestId

__all__ = ["SESSION_FIELDS", "Gateway", "create_gateway_app"]

logger = logging.getLogger("sie_worker.gateway")

_OPENAI_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")
_NATIVE = ("encode", "score", "extract", "generate")
# Where a session key comes from, after the X-Session-Id header: JSON body fields.
SESSION_FIELDS = ("user", "prompt_cache_key", "routing_key")


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
    routes = [
        Route("/healthz", gateway.healthz, methods=["GET"]),
        Route("/readyz", gateway.readyz, methods=["GET"]),
        Route("/metrics", gateway.metrics, methods=["GET"]),
        Route("/health", gateway.health, methods=["GET"]),
        Route("/v1/models", gateway.list_models, methods=["GET"]),
        Route("/v1/devices", gateway.list_devices, methods=["GET"]),
        Route("/v1/models/{rest:path}", gateway.model_call, methods=["GET", "POST"]),
        *[Route(p, gateway.openai, methods=["POST"]) for p in _OPENAI_PATHS],
        *[
            Route(f"/v1/{kind}/{{model:path}}", gateway.native, methods=["POST"])
            for kind in _NATIVE
        ],
        Route("/v1/configs", gateway.configs, methods=["GET", "PUT", "DELETE"]),
        Route("/v1/configs/{rest:path}", gateway.configs, methods=["GET", "PUT", "DELETE"]),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(RequestId), Middleware(BearerAuth, api_key=settings.api_key)],
        exception_handlers=dict(EXCEPTION_HANDLERS),
        lifespan=gateway.lifespan,
    )
    app.router.redirect_slashes = False  # clients (sie-sdk) treat any redirect as an error
    app.state.gateway = gateway
    return app


class Gateway:
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
        self.limits = RelayLimits(settings.connect_timeout_s, settings.read_timeout_s)
        self._injected = client
        self._client = client
        self._kube = kube
        self.local: LocalDiscovery | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            raise RuntimeError("the gateway app was not started (lifespan not run)")
        return self._client

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
        kube = self._kube
        if kube is None and any(s.endpoints is None for s in self.specs):
            kube = KubeDiscovery(self.fleet, self.specs, cluster_namespace(self.settings.namespace))
        kube_client = kube.client() if kube is not None else None  # fails at start, not later
        if any(s.endpoints is not None for s in self.specs):
            self.local = LocalDiscovery(
                self.fleet, self.settings.pools_file, self.specs, self.settings.reload_interval_s
            )
        self._client = self._injected or httpx.AsyncClient(
            trust_env=False,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
            timeout=httpx.Timeout(self.settings.poll_timeout_s),
        )
        self._kube = kube
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.fleet.run_pollers, self._client)
                if self.local is not None:
                    tg.start_soon(self.local.run)
                if kube is not None and kube_client is not None:
                    tg.start_soon(kube.run, kube_client)
                try:
                    yield
                finally:
                    self.holder.drain()
                    tg.cancel_scope.cancel()
        finally:
            if self._injected is None:
                await self._client.aclose()

    # -- probes, metrics, health -------------------------------------------------------

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        pools = [
            {
                "pool": g.spec.pool,
                "bundle": g.spec.bundle,
                "discovered": g.discovered,
                "ready_pods": len(g.routable()),
            }
            for g in self.fleet.groups.values()
        ]
        ready = not self.holder.draining and all(p["discovered"] for p in pools)
        body: dict[str, Any] = {
            "status": "ready" if ready else "draining" if self.holder.draining else "not_ready",
            "pools": pools,
        }
        if self._kube is not None and self._kube.last_error:
            body["discovery_error"] = self._kube.last_error
        return JSONResponse(body, status_code=200 if ready else 503)

    async def metrics(self, request: Request) -> Response:
        data = generate_latest(self.gauges.registry)
        return Response(data, headers={"content-type": CONTENT_TYPE_LATEST})

    async def health(self, request: Request) -> Response:
        return JSONResponse(cluster_health(self.fleet.groups.values()))

    # -- merged views --------------------------------------------------------------------

    async def list_models(self, request: Request) -> Response:
        answers = await self._ask_all("/v1/models", request)
        return JSONResponse(merge_model_lists(answers, self.catalogue.models))

    async def list_devices(self, request: Request) -> Response:
        answers = await self._ask_all("/v1/devices", request)
        devices = [
            {**labels, **d}
            for labels, body in answers
            for d in (body.get("devices") or [] if isinstance(body, dict) else [])
            if isinstance(d, dict)
        ]
        return JSONResponse({"devices": devices})

    async def model_call(self, request: Request) -> Response:
        rest: str = request.path_params["rest"]
        if request.method == "GET":
            model = self.catalogue.resolve(rest, self.fleet.known_models())
            merged = merge_model_lists(await self._ask_all("/v1/models", request), ())
            for entry in merged["data"]:
                if entry.get("id") == model:
                    sie: dict[str, Any] = next(
                        (m for m in merged["models"] if m.get("name") == model), {}
                    )
                    return JSONResponse({**sie, **entry})
            if model in self.catalogue.models:
                return JSONResponse(merge_model_lists([], [model])["data"][0])
            raise UnknownModel(f"model {rest!r} is not configured in any pool")
        model, _, action = rest.rpartition("/")
        if action not in ("load", "unload", "pin", "unpin") or not model:
            raise NotFound(f"POST /v1/models/{rest}: use /v1/models/<id>/{{load,unload,pin,unpin}}")
        model = self.catalogue.resolve(model, self.fleet.known_models())
        body = await read_body(request, self.settings.max_body_bytes)
        if action in ("load", "pin"):
            return self._route(request, body, model, None)
        return await self._fan_out_to_holders(request, body, model)

    # -- requests that name a model ------------------------------------------------------

    async def openai(self, request: Request) -> Response:
        body = await read_body(request, self.settings.max_body_bytes)
        payload = _json_object(body)
        model = payload.get("model") if payload is not None else None
        if not isinstance(model, str) or not model:
            raise InvalidRequest(
                "body: expected a JSON object whose field `model` is the id of the model to use"
            )
        known = self.fleet.known_models()
        # A LoRA adapter's request (model:adapter) goes where its base model is.
        model = self.catalogue.base_of(self.catalogue.resolve(model, known), known)
        return self._route(request, body, model, payload)

    async def native(self, request: Request) -> Response:
        raw: str = request.path_params["model"]
        kind = request.url.path.split("/")[2]
        body = await read_body(request, self.settings.max_body_bytes)
        content_type = request.headers.get("content-type", "")
        payload = _json_object(body) if "json" in content_type else None
        known = self.fleet.known_models()
        if kind == "generate":
            model = decode_path_model(raw, self.catalogue, known)
        else:
            model = self.catalogue.resolve(raw, known)
        return self._route(request, body, model, payload)

    async def configs(self, request: Request) -> Response:
        if request.method != "GET":
            raise MethodNotAllowed(
                f"{request.method} {request.url.path}: the gateway does not change configs; "
                "change the chart's `models` and run helm upgrade",
                headers={"Allow": "GET"},
            )
        pods = [p for g in self.fleet.groups.values() for p in g.routable()]
        if not pods:
            raise EngineUnavailable("no pod is ready to answer the Config API")
        pod = min(pods, key=lambda p: (p.outstanding, p.name))
        upstream = self._upstream(request, b"", None)

        async def route(exclude: frozenset[Hashable]) -> Dispatch:
            if pod.name in exclude:
                raise EngineUnavailable(f"pod {pod.name} ({pod.url}) is not answering")
            return PodDispatch(
                self.fleet, pod, Decision(pod.key, pod.name, "least_outstanding"), None
            )

        return RelayResponse(upstream, route, self.limits)

    def _route(
        self, request: Request, body: bytes, model: str, payload: dict[str, Any] | None
    ) -> Response:
        headers = request.headers
        keys = select_pools(
            self.specs,
            self.catalogue,
            self._listings(),
            model,
            pool=headers.get("x-sie-pool"),
            profile=headers.get("x-sie-machine-profile"),
        )
        selection = Selection(
            model, self._width(model, keys), tuple(keys), _session(request, payload)
        )
        upstream = self._upstream(request, body, model)
        chosen: list[PoolKey] = []

        async def route(exclude: frozenset[Hashable]) -> Dispatch:
            pod, decision = await self.holder.pick(selection, exclude)
            chosen.append(pod.key)
            return PodDispatch(self.fleet, pod, decision, model)

        def done(seconds: float) -> None:
            key = chosen[-1] if chosen else keys[0]
            self.gauges.duration.labels(pool=key.pool, bundle=key.bundle).observe(seconds)

        return RelayResponse(upstream, route, self.limits, on_done=done, arrived=time.monotonic())

    # -- helpers -------------------------------------------------------------------------

    def _listings(self) -> dict[PoolKey, frozenset[str] | None]:
        listings: dict[PoolKey, frozenset[str] | None] = {}
        for key, group in self.fleet.groups.items():
            polled = [p for p in group.pods.values() if p.answering and not p.removed]
            listings[key] = frozenset(m for p in polled for m in p.models) if polled else None
        return listings

    def _width(self, model: str, keys: list[PoolKey]) -> int:
        info = self.catalogue.models.get(model)
        if info is not None:
            return info.width
        widths = [
            p.widths[model]
            for k in keys
            for p in self.fleet.groups[k].pods.values()
            if model in p.widths
        ]
        return max(widths, default=1)

    def _upstream(self, request: Request, body: bytes, model: str | None) -> Upstream:
        headers = forward_headers(request.scope["headers"])  # X-Request-Id: see RequestId
        raw_path: bytes = request.scope.get("raw_path") or request.url.path.encode()
        target = raw_path.decode("latin-1").split("?", 1)[0]
        query = request.scope.get("query_string", b"").decode("latin-1")
        return Upstream(
            method=request.method,
            target=f"{target}?{query}" if query else target,
            headers=headers,
            body=body,
            model=model,
        )

    async def _ask_all(self, path: str, request: Request) -> list[tuple[dict[str, str], Any]]:
        """GET ``path`` from every ready pod at once; pods that fail are left out."""
        headers = {
            k: v
            for k, v in forward_headers(request.scope["headers"])
            if k.lower() == "authorization"
        }
        answers: list[tuple[dict[str, str], Any]] = []

        async def ask(pod: PodState) -> None:
            try:
                r = await self.client.get(
                    pod.url + path, headers=headers, timeout=self.settings.poll_timeout_s
                )
                if r.status_code == 200:
                    labels = {"pool": pod.key.pool, "bundle": pod.key.bundle, "pod": pod.name}
                    answers.append((labels, r.json()))
            except (httpx.HTTPError, ValueError):
                return

        async with anyio.create_task_group() as tg:
            for group in self.fleet.groups.values():
                for pod in group.routable():
                    tg.start_soon(ask, pod)
        return sorted(answers, key=lambda a: (a[0]["pool"], a[0]["bundle"], a[0]["pod"]))

    async def _fan_out_to_holders(self, request: Request, body: bytes, model: str) -> Response:
        """unload / unpin on every ready pod that has the model (in the pools allowed)."""
        keys = select_pools(
            self.specs,
            self.catalogue,
            self._listings(),
            model,
            pool=request.headers.get("x-sie-pool"),
            profile=request.headers.get("x-sie-machine-profile"),
        )
        holders = [
            p
            for k in keys
            for p in self.fleet.groups[k].routable()
            if p.models.get(model, "unloaded") != "unloaded"
        ]
        if not holders:
            return JSONResponse({"id": model, "state": "unloaded", "pods": []})
        upstream = self._upstream(request, body, model)
        results: list[tuple[PodState, httpx.Response | SieError]] = []

        async def one(pod: PodState) -> None:
            try:
                response = await self.client.request(
                    "POST",
                    pod.url + upstream.target,
                    headers=list(upstream.headers),
                    content=body,
                    timeout=self.settings.read_timeout_s,
                )
                results.append((pod, response))
            except httpx.HTTPError as exc:
                results.append((pod, EngineUnavailable(f"pod {pod.name} ({pod.url}): {exc}")))
            finally:
                pod.wake.set()

        async with anyio.create_task_group() as tg:
            for pod in holders:
                tg.start_soon(one, pod)
        results.sort(key=lambda r: r[0].name)
        failures = [r for r in results if isinstance(r[1], SieError) or r[1].status_code >= 400]
        pod, chosen = (failures or results)[0]
        if isinstance(chosen, SieError):
            response: Response = error_response(chosen)
        else:
            response = Response(
                chosen.content,
                status_code=chosen.status_code,
                media_type=chosen.headers.get("content-type"),
            )
        response.headers["x-sie-pod"] = ",".join(p.name for p, _ in results)
        return response


def _json_object(body: bytes) -> dict[str, Any] | None:
    if body.lstrip()[:1] != b"{":
        return None
    try:
        data = json.loads(body)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _session(request: Request, payload: dict[str, Any] | None) -> str | None:
    """The session key: ``X-Session-Id``, else the first of :data:`SESSION_FIELDS` in the
    JSON body that is a nonempty string."""
    header = request.headers.get("x-session-id", "").strip()
    if header:
        return header
    if payload is None:
        return None
    for name in SESSION_FIELDS:
        value = payload.get(name)
        if isinstance(value, str) and value:
            return f"{name}:{value}"
    return None
