"""A pod's router in the test's event loop, for in-process gateway tests.

:class:`FakePod` answers the polls a gateway sends a pod router (``/readyz`` with its
slots, ``/v1/models`` with states and widths, ``/v1/devices`` with the devices of each
slot) and streams an OpenAI answer to ``/v1/completions``: ``events`` server-sent events
of ``event_bytes`` each, ``paced_s`` apart (0: as fast as the socket takes them), then
``[DONE]``. It records every inference request it gets, how many events it managed to
write, and whether a stream ended early because the client left.

``gateway_before(specs)`` runs ``create_gateway_app`` for those pools on a real socket
(uvicorn, free port) and yields an ``httpx.AsyncClient`` for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from sie_worker.gateway.app import create_gateway_app
from sie_worker.gateway.catalogue import Catalogue
from sie_worker.gateway.pools import PoolSpec
from sie_worker.gateway.settings import GatewaySettings
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.support.asgi_server import serve

__all__ = ["FakePod", "gateway_before"]


@dataclass
class FakePod:
    """One pod router: ``slots`` slots of ``slot_width`` devices, serving ``models``
    (model -> state) of ``widths``."""

    models: Mapping[str, str]
    widths: Mapping[str, int] = field(default_factory=dict)
    slots: int = 1
    slot_width: int = 1
    events: int = 3
    event_bytes: int = 32
    paced_s: float = 0.0
    requests: list[dict[str, Any]] = field(default_factory=list)
    written: int = 0  # events written by the stream so far
    left_early: asyncio.Event = field(default_factory=asyncio.Event)
    finished: asyncio.Event = field(default_factory=asyncio.Event)

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/readyz", self._readyz),
                Route("/v1/models", self._models),
                Route("/v1/devices", self._devices),
                Route("/v1/completions", self._complete, methods=["POST"]),
                Route("/v1/chat/completions", self._complete, methods=["POST"]),
            ]
        )

    async def _readyz(self, request: Request) -> Response:
        slots = [{"slot": i, "up": True, "ready": True} for i in range(self.slots)]
        return JSONResponse({"status": "ready", "slots": slots})

    async def _models(self, request: Request) -> Response:
        data = [
            {"id": m, "object": "model", "state": s, "width": self.widths.get(m, 1)}
            for m, s in self.models.items()
        ]
        return JSONResponse({"object": "list", "data": data})

    async def _devices(self, request: Request) -> Response:
        devices = [
            {"device": f"cuda:{s * self.slot_width + d}", "slot": s, "model": None}
            for s in range(self.slots)
            for d in range(self.slot_width)
        ]
        return JSONResponse({"devices": devices})

    async def _complete(self, request: Request) -> Response:
        body = await request.json()
        self.requests.append(body)
        model = body.get("model")
        if self.widths.get(model, 1) > self.slot_width:
            # What a worker answers for a model wider than its devices.
            message = f"{model} needs {self.widths[model]} devices; this slot has one"
            error = {"error": {"code": "invalid_config", "message": message}}
            return JSONResponse(error, status_code=400)
        pad = "x" * max(self.event_bytes - 20, 0)

        async def stream() -> AsyncIterator[bytes]:
            done = False
            try:
                for i in range(self.events):
                    yield f'data: {{"n": {i}, "p": "{pad}"}}\n\n'.encode()
                    self.written += 1
                    await asyncio.sleep(self.paced_s)
                yield b"data: [DONE]\n\n"
                done = True
                self.finished.set()
            finally:
                if not done:
                    self.left_early.set()

        return StreamingResponse(stream(), media_type="text/event-stream")


@asynccontextmanager
async def gateway_before(
    specs: Sequence[PoolSpec], tmp_path: Path, **settings: Any
) -> AsyncIterator[httpx.AsyncClient]:
    """The gateway for ``specs`` (pods by ``endpoints``), without model configs."""
    options = {"poll_interval_s": 0.05, "poll_timeout_s": 2.0, "hold_s": 1.0, **settings}
    config = GatewaySettings(tmp_path / "pools.yaml", **options)
    app = create_gateway_app(config, specs=tuple(specs), catalogue=Catalogue.empty())
    async with (
        serve(app) as port,
        httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=20
        ) as client,
    ):
        yield client
