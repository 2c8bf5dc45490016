"""One model call for router and gateway: read once, then sent where the hop sends it, else
fanned out to the model's holders, else the hop's answer when none holds it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sie_worker.backends.model_calls import model_call
from sie_worker.backends.routed import RoutedRequest
from sie_worker.http.fan_out import Target


@dataclass
class _FanOut:
    seen: list[tuple[RoutedRequest, list[str], str]] = field(default_factory=list)

    async def fan_out(
        self, call: RoutedRequest, targets: Sequence[Target], header: str
    ) -> Response:
        self.seen.append((call, [t.label for t in targets], header))
        return JSONResponse({"fanned_out": [t.label for t in targets]})


@dataclass
class _Hop:
    """A hop that sends ``load`` itself, holds models in ``holding`` and answers the rest."""

    holding: dict[str, list[str]]
    calls: Any = field(default_factory=_FanOut)
    holder_header: str = "x-holder"
    sent: list[tuple[str | None, str]] = field(default_factory=list)

    def request_target(self, request: Request) -> str:
        return request.url.path

    async def model_ids(self, request: Request) -> set[str]:
        return {"Org/M", "n"}

    async def model_detail(self, model: str, request: Request) -> Response:
        return JSONResponse({"detail": model})

    async def send_model_call(
        self, call: RoutedRequest, action: str, request: Request
    ) -> Response | None:
        if action != "load":
            return None
        self.sent.append((call.model, action))
        return JSONResponse({"sent": call.model})

    def model_holders(self, model: str, action: str, request: Request) -> list[Target]:
        return [Target(name, name, f"http://{name}") for name in self.holding.get(model, [])]

    def none_holds(self, model: str, action: str, call: RoutedRequest) -> Response:
        return JSONResponse({"none": model, "carried": call.model})


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def _post(hop: _Hop, path: str, method: str = "POST") -> httpx.Response:
    app = Starlette(
        routes=[Route("/v1/models/{rest:path}", partial(model_call, hop), methods=["GET", "POST"])]
    )
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://hop") as client:
        return await client.request(method, path)


@pytest.mark.anyio
async def test_a_get_is_the_hops_view_of_the_model() -> None:
    answer = await _post(_Hop({}), "/v1/models/org/m", "GET")
    assert answer.json() == {"detail": "org/m"}


@pytest.mark.anyio
async def test_a_call_the_hop_sends_itself_carries_the_model_by_the_one_id_rule() -> None:
    hop = _Hop({"Org/M": ["a"]})
    assert (await _post(hop, "/v1/models/org/m/load")).json() == {"sent": "Org/M"}
    assert hop.calls.seen == []


@pytest.mark.anyio
async def test_else_it_goes_to_every_holder_at_once() -> None:
    hop = _Hop({"Org/M": ["a", "b"]})
    assert (await _post(hop, "/v1/models/Org/M/unload")).json() == {"fanned_out": ["a", "b"]}
    call, labels, header = hop.calls.seen[0]
    # Only a call that brings the model in is accounted as a load: unload carries none.
    assert (call.model, labels, header) == (None, ["a", "b"], "x-holder")


@pytest.mark.anyio
async def test_with_no_holder_the_hop_answers_and_pin_carries_the_model() -> None:
    hop = _Hop({})
    assert (await _post(hop, "/v1/models/n/unpin")).json() == {"none": "n", "carried": None}
    assert (await _post(hop, "/v1/models/n/pin")).json() == {"none": "n", "carried": "n"}
