"""The model calls of a hop (router and gateway): ``GET /v1/models/<id>`` and ``POST
/v1/models/<id>/<action>``, one function for both servers (:func:`model_call`) with what
differs plugged in (:class:`ModelCallHop`).

A ``GET`` is the hop's merged view of the model. A ``POST`` is read once
(:func:`~sie_worker.backends.routed.model_action`: the model by the one id rule, the action)
and then, in this order:

1. sent where the hop sends it (:meth:`ModelCallHop.send_model_call`): the router's named
   slot, and ``load`` (the router) or ``load`` / ``pin`` (the gateway) where a request for
   the model would go;
2. else fanned out to every backend holding the model (:meth:`ModelCallHop.model_holders`,
   :meth:`~sie_worker.backends.hop.OwnCalls.fan_out`);
3. else what the hop answers when none holds it (:meth:`ModelCallHop.none_holds`).

Only calls that bring the model in (``load``, ``pin``) carry it as the routed request's
``model``: only they are accounted as a load on the backend that takes them.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Protocol

from starlette.requests import Request
from starlette.responses import Response

from sie_worker.backends.hop import OwnCalls
from sie_worker.backends.routed import RoutedRequest, model_action
from sie_worker.http.fan_out import Target
from sie_worker.http.headers import forward_headers

__all__ = ["ModelCallHop", "model_call"]


class ModelCallHop(Protocol):
    """What a hop plugs into :func:`model_call`."""

    @property
    def calls(self) -> OwnCalls: ...

    @property
    def holder_header(self) -> str:
        """The header a fan-out's answer lists its targets in (``x-sie-slot``, ...)."""
        ...

    async def model_detail(self, model: str, request: Request) -> Response:
        """``GET /v1/models/<model>``: the hop's merged view of it (404 when unknown)."""
        ...

    def request_target(self, request: Request) -> str:
        """The raw path and query sent on (less what only this hop reads)."""
        ...

    async def model_ids(self, request: Request) -> Collection[str]:
        """The ids the hop resolves a model call's model among."""
        ...

    async def send_model_call(
        self, call: RoutedRequest, action: str, request: Request
    ) -> Response | None:
        """The call sent where the hop sends it; None: to the model's holders."""
        ...

    def model_holders(self, model: str, action: str, request: Request) -> Sequence[Target]:
        """The backends a call of ``action`` on ``model`` goes to, all at once."""
        ...

    def none_holds(self, model: str, action: str, call: RoutedRequest) -> Response:
        """The answer when no backend holds the model."""
        ...


async def model_call(hop: ModelCallHop, request: Request) -> Response:
    """The merged view of one model (``GET``), or one of its actions (``POST``: ``load``,
    ``unload``, ``pin``, ``unpin``) sent where the hop sends it, else to every backend
    holding the model.

    At ``hop``, as the module's docstring says."""
    rest: str = request.path_params["rest"]
    if request.method == "GET":
        return await hop.model_detail(rest, request)
    model, action = model_action(rest, await hop.model_ids(request))
    body = await request.body()  # its size limit: FrontDoor
    headers = forward_headers(request.scope["headers"])  # X-Request-Id: see FrontDoor
    loads = action in ("load", "pin")
    target = hop.request_target(request)
    call = RoutedRequest(request.method, target, headers, body, model if loads else None)
    sent = await hop.send_model_call(call, action, request)
    if sent is not None:
        return sent
    holders = hop.model_holders(model, action, request)
    if holders:
        return await hop.calls.fan_out(call, holders, hop.holder_header)
    return hop.none_holds(model, action, call)
