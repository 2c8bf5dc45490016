"""The pod's slot router (``sie-worker route``): one endpoint in front of the pod's workers.

Each slot is one worker on a localhost port. OpenAI requests go to the slot the policy in
:mod:`sie_worker.router.policy` picks for their ``model``, and so do SIE's native ones
(``/v1/encode``, ``/v1/score``, ``/v1/generate``), whose model is in the path (resolved as
SIE resolves it, :mod:`sie_worker.sie_api.ids`); model management calls go to a
slot named by ``?slot=N`` or ``X-SIE-Slot: N``, else to where the model lives (``load``
and ``pin`` of a model that lives nowhere go where a request would). ``/v1/models`` and
``/v1/devices`` merge every slot's answer and say which slot serves what (``/v1/models``
with SIE's ``models`` list merged too).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import anyio
import httpx
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sie_worker.backends.hop import OwnCalls
from sie_worker.backends.model_calls import model_call
from sie_worker.backends.routed import RoutedRequest, read_routed
from sie_worker.errors import (
    UnknownModel,
)
from sie_worker.http.app_shell import app_shell
from sie_worker.http.fan_out import Target
from sie_worker.http.headers import forward_headers
from sie_worker.http.relay import Upstream
from sie_worker.http.transport import hop_client
from sie_worker.router.choice import AnySlot, ByPolicy, ChooseSlot, NamedSlot, no_slot
from sie_worker.router.merge import merge_devices, merge_models
from sie_worker.router.metrics import RouterMetrics
from sie_worker.router.model_server_metrics import pod_series
from sie_worker.router.relay import SlotRelayResponse
from sie_worker.router.request import SLOT_HEADER, named_slot, request_target
from sie_worker.router.settings import RouterSettings
from sie_worker.router.state import RoutingPolicy, SlotTable
from sie_worker.sie_api.ids import resolve_model_id
from sie_worker.sie_api.models import describes, merge_model_infos, model_detail

__all__ = ["SLOT_HEADER", "build_client", "create_router_app"]

_OPENAI_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
# SIE's native routes; the model is in the path ('/' written '__' for generate).
_SIE_PATHS = ("/v1/encode/{model:path}", "/v1/score/{model:path}", "/v1/generate/{model:path}")


def build_client(settings: RouterSettings) -> httpx.AsyncClient:
    """The client of the router's own calls to its workers: polls, fan-outs, merged views."""
    return hop_client(httpx.Timeout(settings.read_timeout_s, connect=settings.connect_timeout_s))


def create_router_app(
    settings: RouterSettings,
    *,
    client: httpx.AsyncClient | None = None,
    policy: RoutingPolicy | None = None,
) -> Starlette:
    """The router app; ``client`` (e.g. over ``MockTransport``) replaces the pooled one."""
    router = _Router(settings, client, policy)
    routes = [
        # The hot routes first: Starlette tries routes in order, and these paths are exact.
        *[Route(p, router.inference, methods=["POST"]) for p in _OPENAI_PATHS],
        Route("/healthz", router.healthz, methods=["GET"]),
        Route("/readyz", router.readyz, methods=["GET"]),
        Route("/metrics", router.metrics, methods=["GET"]),
        Route("/v1/models", router.list_models, methods=["GET"]),
        Route("/v1/devices", router.list_devices, methods=["GET"]),
        Route("/v1/models/{rest:path}", partial(model_call, router), methods=["GET", "POST"]),
        *[Route(p, router.inference, methods=["POST"]) for p in _SIE_PATHS],
        Route("/v1/configs", router.configs, methods=["GET"]),
        Route("/v1/configs/{rest:path}", router.configs, methods=["GET", "PUT", "DELETE"]),
        Route("/v1/{rest:path}", router.passthrough, methods=["GET", "POST", "PUT", "DELETE"]),
    ]
    app = app_shell(routes, settings, router.lifespan)
    app.state.table = router.table
    return app


class _Router:
    def __init__(
        self,
        settings: RouterSettings,
        client: httpx.AsyncClient | None,
        policy: RoutingPolicy | None,
    ) -> None:
        self.settings = settings
        self.table = SlotTable(settings, RouterMetrics(settings.slot_count), policy=policy)
        self.calls = OwnCalls(client, partial(build_client, settings), "router", settings)

    @property
    def client(self) -> httpx.AsyncClient:
        return self.calls.client

    @asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        async with self.calls.running() as (client, connections):
            self.table.connections = connections
            async with anyio.create_task_group() as tg:
                for slot in range(self.settings.slot_count):
                    tg.start_soon(self.table.run_poller, slot, client)
                try:
                    yield
                finally:
                    tg.cancel_scope.cancel()

    # -- probes and metrics --------------------------------------------------------------

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        body = {
            "status": "ready" if self.table.any_ready() else "not_ready",
            "slots": self._slot_summaries(),
        }
        return JSONResponse(body, status_code=200 if self.table.any_ready() else 503)

    async def metrics(self, request: Request) -> Response:
        data = generate_latest(self.table.metrics.registry)
        data += await pod_series(self.client, self.table.slots, request.headers)
        return Response(data, headers={"content-type": CONTENT_TYPE_LATEST})

    # -- merged views --------------------------------------------------------------------

    async def list_models(self, request: Request) -> Response:
        answers = await self._answers_by_slot("/v1/models", request)
        infos = merge_model_infos(
            a["models"] for a in answers.values() if isinstance(a.get("models"), list)
        )
        body = {"object": "list", "data": merge_models(answers), "models": infos}
        return JSONResponse({**body, "slots": self._slot_summaries()})

    async def list_devices(self, request: Request) -> Response:
        answers = await self._answers_by_slot("/v1/devices", request)
        return JSONResponse({"devices": merge_devices(answers), "slots": self._slot_summaries()})

    # -- model calls ---------------------------------------------------------------------

    # Plugged into backends.model_calls.model_call (ModelCallHop).
    holder_header = SLOT_HEADER

    def request_target(self, request: Request) -> str:
        return request_target(request)

    async def model_ids(self, request: Request) -> set[str]:
        if named_slot(request, self.settings.slot_count) is None:
            await self._first_poll()  # the ids the slots serve, to resolve the model
        return self.table.known_models()

    async def send_model_call(
        self, call: RoutedRequest, action: str, request: Request
    ) -> Response | None:
        named = named_slot(request, self.settings.slot_count)
        if named is not None:
            return self._relay(call, NamedSlot(self.table, named))
        if action == "load":
            return self._relay(call, ByPolicy(self.table, call.model or ""))
        return None

    def model_holders(self, model: str, action: str, request: Request) -> list[Target]:
        return self._targets(self._holders(model, pinned_only=action == "unpin"))

    def none_holds(self, model: str, action: str, call: RoutedRequest) -> Response:
        if action == "pin":  # brought in where a request for it would go, then pinned
            return self._relay(call, ByPolicy(self.table, model))
        return self._relay(call, AnySlot(self.table))

    async def model_detail(self, model: str, request: Request) -> Response:
        answers = await self._answers_by_slot("/v1/models", request)
        entries = {e["id"]: e for e in merge_models(answers)}
        model_id = resolve_model_id(model, entries)
        if model_id is None:
            raise UnknownModel(f"model {model!r} is not configured on any slot of this pod")
        infos = merge_model_infos(
            a["models"] for a in answers.values() if isinstance(a.get("models"), list)
        )
        info = next((i for i in infos if describes(i, model_id)), None)
        entry = entries[model_id]
        return JSONResponse(entry if info is None else model_detail(entry, info))

    # -- OpenAI requests and the rest ----------------------------------------------------

    async def inference(self, request: Request) -> Response:
        # An OpenAI request or an SIE one (model in the path): the router's one request
        # path, parse (and resolve) -> choose -> relay.
        named = named_slot(request, self.settings.slot_count)
        if named is None:
            await self._first_poll()  # the ids the slots serve, to resolve the model
        routed = await read_routed(
            request,
            self.table.known_models(),
            self.settings.prefix,
            target=request_target(request),
        )
        if named is not None:
            return self._relay(routed, NamedSlot(self.table, named))
        pick = ByPolicy(self.table, routed.model or "", routed.prefix, routed.adapter)
        return self._relay(routed, pick)

    async def configs(self, request: Request) -> Response:
        named = named_slot(request, self.settings.slot_count)
        upstream = await self._upstream(request, model=None)
        if named is not None:
            return self._relay(upstream, NamedSlot(self.table, named))
        await self._first_poll()
        if request.method == "GET":
            return self._relay(upstream, AnySlot(self.table))
        # Every slot serves the same config set, so writes go to all that answer.
        up = [s.index for s in self.table.slots if s.up]
        if not up:
            raise no_slot(self.table)
        return await self.calls.fan_out(upstream, self._targets(up), SLOT_HEADER)

    async def passthrough(self, request: Request) -> Response:
        named = named_slot(request, self.settings.slot_count)
        upstream = await self._upstream(request, model=None)
        await self._first_poll()
        pick = NamedSlot(self.table, named) if named is not None else AnySlot(self.table)
        return self._relay(upstream, pick)

    # -- helpers -------------------------------------------------------------------------

    def _relay(self, upstream: Upstream, pick: ChooseSlot) -> Response:
        return SlotRelayResponse(self.table, upstream, pick)

    def _holders(self, model: str, *, pinned_only: bool) -> list[int]:
        holders = []
        for view in self.table.views():
            entry = view.models.get(model)
            if not view.up or entry is None:
                continue
            if entry.pinned if pinned_only else entry.state in ("ready", "loading"):
                holders.append(view.index)
        return holders

    async def _first_poll(self) -> None:
        """Right after start, wait (bounded) until every slot was polled once."""
        if self.table.polled_once.is_set():
            return
        metrics = self.table.metrics
        metrics.queued.inc()
        try:
            with anyio.move_on_after(self.settings.poll_timeout_s + 1.0):
                await self.table.polled_once.wait()
        finally:
            metrics.queued.dec()

    async def _upstream(self, request: Request, *, model: str | None) -> Upstream:
        body = await request.body()  # its size limit: FrontDoor
        return Upstream(
            method=request.method,
            target=request_target(request),
            headers=forward_headers(request.scope["headers"]),
            body=body,
            model=model,
        )

    def _targets(self, slots: list[int]) -> list[Target]:
        return [
            Target(f"slot {i}", str(i), self.table.slots[i].url, partial(self.table.poke, i))
            for i in sorted(slots)
        ]

    async def _answers_by_slot(self, path: str, request: Request) -> dict[int, Any]:
        """Every answering slot's answer to ``path``, by slot."""
        targets = self._targets([s.index for s in self.table.slots if s.up])
        answers = await self.calls.ask_all(targets, path, request.scope["headers"])
        return {int(target.label): body for target, body in answers}

    def _slot_summaries(self) -> list[dict[str, Any]]:
        return [
            {
                "slot": s.index,
                "port": self.settings.worker_ports[s.index],
                "up": s.up,
                "ready": s.up and s.ready,
                "inflight": s.outstanding,
                "error": None if s.up else s.last_error,
            }
            for s in self.table.slots
        ]
