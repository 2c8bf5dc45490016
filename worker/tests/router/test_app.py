"""The router app in front of fake workers (small Starlette apps mimicking the worker API).

Each fake worker owns a few devices, loads models on demand (evicting the least recently
used unpinned one), and counts its loads. Each runs on uvicorn behind a TCP front that
can make its port refuse connections or hang, so the router talks to them over real sockets.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import anyio
import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from tests.support.asgi_server import TcpFront, serve

from sie_worker.http import relay as http_relay
from sie_worker.http.request import BODY_NEEDS_MODEL
from sie_worker.router.app import create_router_app
from sie_worker.router.settings import RouterSettings
from sie_worker.sie_api.ids import resolve_model_id
from sie_worker.sie_api.models import sie_state

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


@dataclass
class FakeWorker:
    """One slot's worker: its devices, its configured models (id → width), its loads."""

    port: int
    devices: int = 1
    widths: dict[str, int] = field(
        default_factory=lambda: {"a": 1, "b": 1, "c": 1, "d": 1, "org/m:fast": 1}
    )
    load_delay_s: float = 0.01
    load_gate: anyio.Event | None = None  # set: loads wait for it instead of the delay
    loads: Counter[str] = field(default_factory=Counter)
    calls: list[tuple[str, str, dict[str, str], bytes]] = field(default_factory=list)
    gate: dict[str, anyio.Event] = field(default_factory=dict)  # model → blocks its requests
    answer: dict[str, Response] = field(default_factory=dict)  # model → canned answer
    adapters: dict[str, tuple[str, ...]] = field(default_factory=dict)  # model → its LoRAs

    def __post_init__(self) -> None:
        self.models: dict[str, dict[str, Any]] = {
            m: {"state": "unloaded", "devices": [], "pinned": False, "last_used": None}
            for m in self.widths
        }
        self.held: list[str | None] = [None] * self.devices
        self._loading: dict[str, anyio.Event] = {}
        self.inflight: Counter[str] = Counter()
        self.poll_headers: dict[str, str] = {}

    def preload(self, model: str, *, last_used: float = 0.0, pinned: bool = False) -> None:
        index = self.held.index(None)
        self.held[index] = model
        self.models[model].update(
            state="ready", devices=[f"cuda:{index}"], last_used=last_used, pinned=pinned
        )

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/readyz", self._readyz),
                Route("/v1/models", self._list),
                Route("/v1/devices", self._devices),
                Route("/v1/models/{rest:path}", self._action, methods=["POST"]),
                Route("/v1/completions", self._complete, methods=["POST"]),
                Route("/v1/chat/completions", self._complete, methods=["POST"]),
                Route("/v1/encode/{model:path}", self._sie, methods=["POST"]),
                Route("/v1/generate/{model:path}", self._sie, methods=["POST"]),
                Route("/v1/configs/{rest:path}", self._config, methods=["PUT", "GET"]),
            ]
        )

    async def _readyz(self, request: Request) -> Response:
        return JSONResponse({"status": "ready"})

    async def _list(self, request: Request) -> Response:
        self.poll_headers = dict(request.headers)
        data = [
            {
                "id": m,
                "object": "model",
                "width": self.widths[m],
                "error": None,
                "inflight": self.inflight[m],
                **info,
            }
            for m, info in self.models.items()
        ]
        # the worker lists each LoRA adapter of a model after it, with the model as parent
        data += [
            {**entry, "id": f"{entry['id']}:{adapter}", "parent": entry["id"]}
            for entry in list(data)
            for adapter in self.adapters.get(entry["id"], ())
        ]
        # SIE's list, one entry per config (here: per model, with its one profile)
        infos = [
            {
                "name": m,
                "state": sie_state(i["state"]),
                "profiles": {"default": {"state": sie_state(i["state"])}},
            }
            for m, i in self.models.items()
        ]
        return JSONResponse({"object": "list", "data": data, "models": infos})

    async def _devices(self, request: Request) -> Response:
        return JSONResponse(
            {"devices": [{"device": f"cuda:{i}", "model": m} for i, m in enumerate(self.held)]}
        )

    def _record(self, request: Request, body: bytes) -> None:
        target = request.scope["raw_path"].decode()
        if request.scope["query_string"]:
            target += "?" + request.scope["query_string"].decode()
        self.calls.append((request.method, target, dict(request.headers), body))

    async def _ensure(self, model: str) -> Response | None:
        if model not in self.models:
            return _error(404, "unknown_model", f"unknown model {model}")
        info = self.models[model]
        if info["state"] == "ready":
            return None
        if info["state"] == "loading":
            await self._loading[model].wait()
            return None
        if None not in self.held:
            victims = [
                m
                for m, i in self.models.items()
                if i["state"] == "ready" and not i["pinned"] and not self.inflight[m]
            ]
            if not victims:
                return _error(409, "placement_failed", "every device holds a pinned model")
            victim = min(victims, key=lambda m: self.models[m]["last_used"] or 0.0)
            self.held[self.held.index(victim)] = None
            self.models[victim].update(state="unloaded", devices=[])
        index = self.held.index(None)
        self.held[index] = model
        self._loading[model] = anyio.Event()
        info.update(state="loading", devices=[f"cuda:{index}"])
        self.loads[model] += 1
        if self.load_gate is not None:
            await self.load_gate.wait()
        else:
            await anyio.sleep(self.load_delay_s)
        info.update(state="ready", last_used=time.time())
        self._loading.pop(model).set()
        return None

    async def _action(self, request: Request) -> Response:
        self._record(request, await request.body())
        model, _, action = request.path_params["rest"].rpartition("/")
        if action in ("load", "pin"):
            refused = await self._ensure(model)
            if refused is not None:
                return refused
            self.models[model]["pinned"] = self.models[model]["pinned"] or action == "pin"
        elif action == "unload" and self.models.get(model, {}).get("state") == "ready":
            self.held[self.held.index(model)] = None
            self.models[model].update(state="unloaded", devices=[], pinned=False)
        elif action == "unpin" and model in self.models:
            self.models[model]["pinned"] = False
        return JSONResponse({"id": model, "port": self.port, **self.models.get(model, {})})

    async def _complete(self, request: Request) -> Response:
        body = await request.body()
        self._record(request, body)
        payload = json.loads(body)
        model = payload["model"]
        base, _, adapter = model.rpartition(":")
        if adapter in self.adapters.get(base, ()):
            model = base  # served by its base model, as the worker does
        if model in self.answer:
            return self.answer[model]
        refused = await self._ensure(model)
        if refused is not None:
            return refused
        self.inflight[model] += 1
        try:
            if model in self.gate:
                await self.gate[model].wait()
            self.models[model]["last_used"] = time.time()
        finally:
            self.inflight[model] -= 1
        if payload.get("stream"):
            chunks = [f"data: {json.dumps({'n': i, 'port': self.port})}\n\n" for i in range(3)]
            return StreamingResponse(
                iter([*chunks, "data: [DONE]\n\n"]), media_type="text/event-stream"
            )
        return JSONResponse({"model": model, "port": self.port, "choices": [{"text": "ok"}]})

    async def _sie(self, request: Request) -> Response:
        """SIE's routes: the model in the path (``__`` for ``/`` on generate), any body."""
        self._record(request, await request.body())
        generate = request.url.path.startswith("/v1/generate/")
        asked = request.path_params["model"]
        model = resolve_model_id(asked, self.models, generate=generate) or asked
        refused = await self._ensure(model)
        return refused or JSONResponse({"model": model, "port": self.port})

    async def _config(self, request: Request) -> Response:
        self._record(request, await request.body())
        return JSONResponse({"id": request.path_params["rest"], "port": self.port})


@dataclass
class Pod:
    client: httpx.AsyncClient
    app: Starlette
    fronts: list[TcpFront]
    workers: list[FakeWorker]

    async def refuse(self, *slots: int) -> None:
        """The slots' workers stop listening: connections are refused."""
        for slot in slots:
            await self.fronts[slot].refuse()

    async def accept(self, *slots: int) -> None:
        for slot in slots:
            await self.fronts[slot].accept()

    def hang(self, slot: int) -> None:
        """The slot's worker keeps its connections but stops answering on any of them."""
        self.fronts[slot].hang()

    async def until(self, condition: Callable[[], bool], what: str) -> None:
        """Wait (bounded) for the router's background polls to notice a change."""
        with anyio.fail_after(10):
            while not condition():  # noqa: ASYNC110 - state owned by the router's poll tasks
                await anyio.sleep(0.01)
        assert condition(), what

    def slot_up(self, slot: int) -> bool:
        return bool(self.app.state.table.slots[slot].up)

    async def metric(self, line_start: str) -> float:
        text = (await self.client.get("/metrics")).text
        for line in text.splitlines():
            if line.startswith(line_start + " "):
                return float(line.split()[-1])
        raise AssertionError(f"{line_start} not in /metrics")


@asynccontextmanager
async def pod(
    slots: int = 4,
    *,
    devices: int = 1,
    api_key: str | None = None,
    poll_interval_s: float = 0.02,
    poll_timeout_s: float = 2.0,
    hung: tuple[int, ...] = (),
    **overrides: Any,
) -> AsyncIterator[Pod]:
    """``slots`` fake workers, each served by uvicorn behind a :class:`TcpFront` (which can
    refuse or hang), and the router app in front of them, over real sockets.

    Polls are frequent, so changes show quickly. Their timeout is generous: a busy test
    machine can starve the event loop for a while, and three timed-out polls would take a
    healthy slot out of rotation; tests of hung slots pass a short one. The slots in
    ``hung`` hang before the router starts (its first polls of them time out)."""
    workers = [FakeWorker(port=0, devices=devices) for _ in range(slots)]
    fronts: list[TcpFront] = []
    async with contextlib.AsyncExitStack() as stack:
        for worker in workers:
            front = TcpFront(await stack.enter_async_context(serve(worker.app(), lifespan="off")))
            worker.port = await front.start()
            stack.push_async_callback(front.close)
            fronts.append(front)
        for slot in hung:
            fronts[slot].hang()
        settings = RouterSettings(
            worker_ports=tuple(w.port for w in workers),
            api_key=api_key,
            poll_interval_s=poll_interval_s,
            poll_timeout_s=poll_timeout_s,
            **overrides,
        )
        app = create_router_app(settings)
        async with app.router.lifespan_context(app):
            client = httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://router"
            )
            async with client:
                yield Pod(client, app, fronts, workers)


def _sample(p: Pod, name: str) -> float | None:
    value: float | None = p.app.state.table.metrics.registry.get_sample_value(name)
    return value


async def _complete(client: httpx.AsyncClient, model: str, **extra: Any) -> httpx.Response:
    return await client.post("/v1/completions", json={"model": model, "prompt": "hi", **extra})


async def _concurrently(calls: list[Callable[[], Awaitable[httpx.Response]]]) -> list[Any]:
    results: list[Any] = [None] * len(calls)

    async def run(i: int) -> None:
        results[i] = await calls[i]()

    async with anyio.create_task_group() as tg:
        for i in range(len(calls)):
            tg.start_soon(run, i)
    return results


# -- routing -----------------------------------------------------------------------------


async def test_a_burst_for_one_model_loads_it_once_on_one_slot() -> None:
    async with pod() as p:
        answers = await _concurrently([partial(_complete, p.client, "a") for _ in range(12)])
        assert {r.status_code for r in answers} == {200}
        assert len({r.headers["x-sie-slot"] for r in answers}) == 1
        assert sum(w.loads["a"] for w in p.workers) == 1


async def test_repeated_requests_for_a_loaded_model_go_where_it_is_ready() -> None:
    async with pod() as p:
        p.workers[2].preload("b")
        await p.until(lambda: p.app.state.table.slots[2].view().state_of("b") == "ready", "poll")
        for _ in range(3):
            r = await _complete(p.client, "b")
            assert (r.headers["x-sie-slot"], r.headers["x-sie-route-reason"]) == ("2", "ready")
        assert sum(w.loads["b"] for w in p.workers) == 0


async def test_a_lora_adapter_request_goes_where_its_base_model_is_ready() -> None:
    async with pod() as p:
        for worker in p.workers:
            worker.adapters["b"] = ("sql", "java")
        p.workers[2].preload("b")
        await p.until(lambda: p.app.state.table.slots[2].view().state_of("b") == "ready", "poll")
        for model in ("b:sql", "b:java", "b"):
            r = await _complete(p.client, model)
            assert r.status_code == 200, r.text
            assert (r.headers["x-sie-slot"], r.headers["x-sie-route-reason"]) == ("2", "ready")
        assert sum(w.loads["b"] for w in p.workers) == 0
        # the adapters are not models of their own for placement
        assert "b:sql" not in p.app.state.table.slots[2].view().models


async def test_sie_routes_go_where_the_model_in_their_path_is_ready() -> None:
    async with pod() as p:
        p.workers[1].preload("org/m:fast")
        await p.until(
            lambda: p.app.state.table.slots[1].view().state_of("org/m:fast") == "ready", "poll"
        )
        body = b"\x81\xa5items\x90"  # msgpack: the router relays it, never reads it
        msgpack = {"content-type": "application/msgpack"}
        for path in (
            "/v1/encode/org/m:fast",
            "/v1/generate/org__m:fast",
            "/v1/generate/ORG__M:FAST",
        ):
            r = await p.client.post(path, content=body, headers=msgpack)
            assert r.status_code == 200, (path, r.text)
            assert (r.headers["x-sie-slot"], r.headers["x-sie-route-reason"]) == ("1", "ready")
        assert p.workers[1].calls[-1][1] == "/v1/generate/ORG__M:FAST"  # the path as sent
        assert p.workers[1].calls[-1][3] == body
        assert sum(w.loads["org/m:fast"] for w in p.workers) == 0


async def test_different_models_spread_over_free_slots() -> None:
    async with pod() as p:
        answers = await _concurrently([partial(_complete, p.client, m) for m in "abcd"])
        assert sorted(r.headers["x-sie-slot"] for r in answers) == ["0", "1", "2", "3"]
        assert {r.headers["x-sie-route-reason"] for r in answers} == {"free_device"}


async def test_full_pod_evicts_the_model_idle_longest() -> None:
    async with pod(slots=2) as p:
        p.workers[0].preload("a", last_used=time.time() - 10)
        p.workers[1].preload("b", last_used=time.time() - 100)
        await p.until(lambda: p.app.state.table.slots[1].view().state_of("b") == "ready", "poll")
        r = await _complete(p.client, "c")
        assert (r.headers["x-sie-slot"], r.headers["x-sie-route-reason"]) == ("1", "evict_lru")
        assert p.workers[1].models["b"]["state"] == "unloaded"
        assert p.workers[0].models["a"]["state"] == "ready"


async def test_request_waits_in_the_router_while_every_slot_is_loading() -> None:
    async with pod(slots=2) as p:
        gate = anyio.Event()
        for worker in p.workers:
            worker.load_gate = gate
        answers: dict[str, httpx.Response] = {}

        async def send(model: str) -> None:
            answers[model] = await _complete(p.client, model)

        async with anyio.create_task_group() as tg:
            tg.start_soon(send, "a")
            tg.start_soon(send, "b")
            await p.until(lambda: all(w.loads.total() == 1 for w in p.workers), "both loading")
            tg.start_soon(send, "c")
            await p.until(lambda: _sample(p, "sie_router_queued_requests") == 3, "queued")
            assert not [c for w in p.workers for c in w.calls if b'"c"' in c[3]]
            gate.set()
        assert {m: r.status_code for m, r in answers.items()} == {"a": 200, "b": 200, "c": 200}
        assert answers["c"].headers["x-sie-route-reason"] == "evict_lru"
        assert sum(w.loads["c"] for w in p.workers) == 1
        assert await p.metric("sie_router_queued_requests") == 0


async def test_streaming_answers_pass_through_as_server_sent_events() -> None:
    async with pod(slots=1) as p:
        r = await _complete(p.client, "a", stream=True)
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.text.endswith("data: [DONE]\n\n")
        assert r.text.count("data: ") == 4


async def test_worker_errors_pass_through_unchanged() -> None:
    async with pod(slots=1) as p:
        p.workers[0].answer["a"] = _error(409, "placement_failed", "cuda:0 holds pinned x")
        r = await _complete(p.client, "a")
        assert r.status_code == 409
        assert r.json() == {
            "error": {"code": "placement_failed", "message": "cuda:0 holds pinned x"}
        }
        unknown = await _complete(p.client, "nope")
        assert unknown.status_code == 404
        assert unknown.json()["error"]["code"] == "unknown_model"


async def test_request_without_a_model_is_refused_naming_the_field() -> None:
    async with pod(slots=1) as p:
        r = await p.client.post("/v1/chat/completions", json={"messages": []})
        assert r.status_code == 400
        assert r.json()["error"]["code"] == "invalid_request"
        assert r.json()["error"]["param"] == "model"
        assert r.json()["error"]["message"] == BODY_NEEDS_MODEL  # the worker's words too


async def test_oversized_body_gets_413() -> None:
    async with pod(slots=1, max_body_bytes=1024) as p:
        r = await _complete(p.client, "a", prompt="x" * 2048)
        assert r.status_code == 413
        assert r.json()["error"]["code"] == "payload_too_large"
        assert p.workers[0].calls == []


# -- model calls -------------------------------------------------------------------------


async def test_load_can_name_a_slot_by_query_or_header() -> None:
    async with pod() as p:
        r = await p.client.post("/v1/models/org/m:fast/load?slot=2")
        assert (r.status_code, r.json().get("port")) == (200, p.workers[2].port), r.text
        assert p.workers[2].calls[-1][:2] == ("POST", "/v1/models/org/m:fast/load")
        r = await p.client.post("/v1/models/b/load", headers={"X-SIE-Slot": "3"})
        assert (r.status_code, r.json().get("port")) == (200, p.workers[3].port), r.text
        assert "x-sie-slot" not in p.workers[3].calls[-1][2]


async def test_a_named_slot_that_missed_its_first_poll_is_still_tried() -> None:
    """One timed-out poll (a busy start) is not "not answering": that takes three in a row."""
    async with pod(slots=2, hung=(1,), poll_timeout_s=0.2, poll_interval_s=60) as p:
        await p.until(lambda: p.app.state.table.slots[1].failures == 1, "first poll timed out")
        assert not p.slot_up(1)
        p.fronts[1].resume()
        r = await p.client.post("/v1/models/b/load?slot=1")
        assert (r.status_code, r.json().get("port")) == (200, p.workers[1].port), r.text


async def test_a_named_slot_out_of_rotation_is_refused_without_calling_it() -> None:
    async with pod(slots=2) as p:
        await p.until(lambda: p.slot_up(1), "first poll")
        await p.refuse(1)
        await p.until(lambda: not p.slot_up(1), "refusing slot left rotation")
        r = await p.client.post("/v1/models/b/load", headers={"X-SIE-Slot": "1"})
        assert r.status_code == 502, r.text
        assert r.json()["error"]["code"] == "engine_unavailable"
        assert "slot 1 (http://127.0.0.1:" in r.json()["error"]["message"]
        assert "is not answering: connection refused" in r.json()["error"]["message"]
        assert p.workers[1].calls == []


async def test_bad_slot_names_are_refused() -> None:
    async with pod() as p:
        r = await p.client.post("/v1/models/a/load?slot=9")
        assert r.status_code == 400
        assert "slot 9 does not exist; this pod has slots 0..3" in r.json()["error"]["message"]
        r = await p.client.post("/v1/models/a/load?slot=1", headers={"X-SIE-Slot": "2"})
        assert r.status_code == 400


async def test_unload_goes_to_every_slot_holding_the_model() -> None:
    async with pod() as p:
        p.workers[0].preload("a")
        p.workers[2].preload("a")
        await p.until(lambda: p.app.state.table.slots[2].view().state_of("a") == "ready", "poll")
        r = await p.client.post("/v1/models/a/unload")
        assert r.status_code == 200
        assert r.headers["x-sie-slot"] == "0,2"
        assert [w.models["a"]["state"] for w in p.workers] == ["unloaded"] * 4


async def test_unload_of_a_model_that_lives_nowhere_is_not_recorded_as_a_load() -> None:
    async with pod(slots=2) as p:
        await p.until(lambda: p.slot_up(1), "poll")
        r = await p.client.post("/v1/models/a/unload")
        assert r.status_code == 200
        views = p.app.state.table.views()
        assert [v.state_of("a") for v in views] == ["unloaded", "unloaded"]
        assert _sample(p, "sie_router_queued_requests") == 0


async def test_load_of_a_model_that_lives_nowhere_goes_where_a_request_would() -> None:
    async with pod() as p:
        p.workers[0].preload("b")
        await p.until(lambda: p.app.state.table.slots[0].view().state_of("b") == "ready", "poll")
        r = await p.client.post("/v1/models/a/load")
        assert r.headers["x-sie-slot"] == "1"
        assert r.headers["x-sie-route-reason"] == "free_device"


async def test_models_list_merges_slots_and_says_which_serves_what() -> None:
    async with pod(slots=3) as p:
        p.workers[1].preload("b")
        await p.until(lambda: p.slot_up(2), "poll")
        body = (await p.client.get("/v1/models")).json()
        entries = {e["id"]: e for e in body["data"]}
        assert len(body["data"]) == len(entries) == 5
        assert (entries["b"]["state"], entries["b"]["slot"]) == ("ready", 1)
        assert [s["state"] for s in entries["b"]["slots"]] == ["unloaded", "ready", "unloaded"]
        assert entries["a"]["slot"] is None
        assert [s["port"] for s in body["slots"]] == [w.port for w in p.workers]
        infos = {m["name"]: m for m in body["models"]}
        assert len(body["models"]) == 5
        assert (infos["b"]["state"], infos["a"]["state"]) == ("loaded", "available")
        one = (await p.client.get("/v1/models/B")).json()
        assert (one["id"], one["slot"]) == ("b", 1)
        assert (one["name"], one["state"], one["worker_state"]) == ("b", "loaded", "ready")
        missing = await p.client.get("/v1/models/zzz")
        assert missing.status_code == 404
        assert missing.headers["x-sie-error-code"] == "MODEL_NOT_FOUND"


async def test_devices_list_merges_slots() -> None:
    async with pod(slots=2, devices=2) as p:
        p.workers[1].preload("c")
        await p.until(lambda: p.slot_up(1), "poll")
        devices = (await p.client.get("/v1/devices")).json()["devices"]
        assert [(d["slot"], d["device"], d["model"]) for d in devices] == [
            (0, "cuda:0", None),
            (0, "cuda:1", None),
            (1, "cuda:0", "c"),
            (1, "cuda:1", None),
        ]


async def test_config_writes_go_to_every_answering_slot() -> None:
    async with pod(slots=3) as p:
        await p.until(lambda: p.slot_up(2), "poll")
        r = await p.client.put("/v1/configs/org/new", content=b"sie_id: org/new\n")
        assert r.status_code == 200
        assert r.headers["x-sie-slot"] == "0,1,2"
        assert all(w.calls[-1][:2] == ("PUT", "/v1/configs/org/new") for w in p.workers)


# -- failures ----------------------------------------------------------------------------


async def test_refusing_slot_leaves_rotation_and_requests_go_elsewhere() -> None:
    async with pod(slots=2) as p:
        await p.until(lambda: p.slot_up(1), "poll")
        await p.refuse(0)
        r = await _complete(p.client, "a")
        assert (r.status_code, r.headers["x-sie-slot"]) == (200, "1")
        assert not p.slot_up(0)
        assert await p.metric('sie_router_slot_up{slot="0"}') == 0
        await p.accept(0)
        await p.until(lambda: p.slot_up(0), "slot 0 back after polls succeed")
        assert await p.metric('sie_router_slot_up{slot="0"}') == 1


async def test_request_in_flight_on_a_slot_that_stops_answering_fails_with_502() -> None:
    async with pod(slots=1, poll_timeout_s=0.2) as p:
        p.workers[0].gate["a"] = anyio.Event()  # the request never finishes by itself
        async with anyio.create_task_group() as tg:
            result: list[httpx.Response] = []

            async def send() -> None:
                result.append(await _complete(p.client, "a"))

            tg.start_soon(send)
            await p.until(lambda: p.workers[0].inflight["a"] == 1, "request reached the slot")
            p.hang(0)
        assert result[0].status_code == 502
        assert result[0].json()["error"]["code"] == "engine_unavailable"
        assert not p.slot_up(0)


async def test_slot_leaving_rotation_while_a_request_connects_sends_it_elsewhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker died with a request still connecting to it: the request never reached a
    worker, so it is routed again instead of failing with 502."""
    connecting = anyio.Event()
    real_open_stream = http_relay.open_stream

    async def open_stream(url: str, *args: Any, **kwargs: Any) -> Any:
        if url.startswith(p.app.state.table.slots[0].url):
            connecting.set()
            await anyio.sleep_forever()  # a connect still in flight when the slot goes down
        return await real_open_stream(url, *args, **kwargs)

    monkeypatch.setattr(http_relay, "open_stream", open_stream)
    async with pod(slots=2) as p:
        p.workers[0].preload("a")
        await p.until(lambda: p.app.state.table.slots[0].view().state_of("a") == "ready", "poll")
        async with anyio.create_task_group() as tg:
            result: list[httpx.Response] = []

            async def send() -> None:
                result.append(await _complete(p.client, "a"))

            tg.start_soon(send)
            with anyio.fail_after(10):
                await connecting.wait()
            await p.refuse(0)
        assert (result[0].status_code, result[0].headers["x-sie-slot"]) == (200, "1")
        assert not [call for call in p.workers[0].calls if call[1] == "/v1/completions"]
        assert p.workers[1].loads["a"] == 1


async def test_no_answering_slot_gives_engine_unavailable() -> None:
    async with pod(slots=2) as p:
        await p.refuse(0, 1)
        await p.until(lambda: not p.slot_up(0) and not p.slot_up(1), "both down")
        r = await _complete(p.client, "a")
        assert r.status_code == 502
        assert r.json()["error"]["code"] == "engine_unavailable"
        assert "slot 0" in r.json()["error"]["message"]
        ready = await p.client.get("/readyz")
        assert ready.status_code == 503


# -- probes, metrics, auth ---------------------------------------------------------------


async def test_readyz_is_200_once_a_slot_is_ready() -> None:
    async with pod(slots=2) as p:
        await p.refuse(1)
        await p.until(lambda: p.slot_up(0), "poll")
        r = await p.client.get("/readyz")
        assert r.status_code == 200
        assert [s["ready"] for s in r.json()["slots"]] == [True, False]
        assert (await p.client.get("/healthz")).status_code == 200


async def test_metrics_report_slots_inflight_queue_and_decisions() -> None:
    async with pod() as p:
        await _complete(p.client, "a")
        await _complete(p.client, "a")
        assert await p.metric("sie_router_slots") == 4
        assert await p.metric('sie_router_decisions_total{reason="free_device"}') == 1
        assert await p.metric('sie_router_decisions_total{reason="ready"}') == 1
        assert await p.metric('sie_router_inflight_requests{slot="0"}') == 0
        assert await p.metric("sie_router_queued_requests") == 0


async def test_inflight_metric_counts_requests_on_their_slot() -> None:
    async with pod(slots=2) as p:
        p.workers[0].gate["a"] = gate = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(_complete, p.client, "a")
            await p.until(lambda: p.workers[0].inflight["a"] == 1, "request reached the slot")
            assert await p.metric('sie_router_inflight_requests{slot="0"}') == 1
            assert await p.metric('sie_router_inflight_requests{slot="1"}') == 0
            gate.set()
        assert await p.metric('sie_router_inflight_requests{slot="0"}') == 0


async def test_api_key_is_required_and_forwarded() -> None:
    async with pod(slots=1, api_key="s3cret") as p:
        denied = await _complete(p.client, "a")
        assert denied.status_code == 401
        assert denied.json()["error"]["code"] == "unauthorized"
        wrong = await p.client.get("/v1/models", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        for open_path in ("/healthz", "/readyz", "/metrics"):
            assert (await p.client.get(open_path)).status_code in (200, 503)
        ok = await p.client.post(
            "/v1/completions",
            json={"model": "a", "prompt": "x"},
            headers={"Authorization": "Bearer s3cret"},
        )
        assert ok.status_code == 200
        completion = [c for c in p.workers[0].calls if c[1] == "/v1/completions"][-1]
        assert completion[2]["authorization"] == "Bearer s3cret"
        assert p.workers[0].poll_headers["authorization"] == "Bearer s3cret"


async def test_unknown_paths_get_the_error_shape() -> None:
    async with pod(slots=1) as p:
        r = await p.client.get("/nowhere")
        assert r.status_code == 404
        assert r.json()["error"]["code"] == "not_found"
        r = await p.client.delete("/healthz")
        assert r.status_code == 405
        assert r.json()["error"]["code"] == "method_not_allowed"


async def test_a_chats_next_turn_goes_to_the_slot_that_holds_its_prefix() -> None:
    async with pod(3) as p:
        for worker in p.workers:
            worker.preload("a")
        await p.until(lambda: all(p.slot_up(s) for s in range(3)), "every slot up")
        messages = [{"role": "system", "content": "You are a careful agent. " * 40}]
        first = await p.client.post(
            "/v1/chat/completions", json={"model": "a", "messages": messages}
        )
        assert first.headers["x-sie-route-reason"] == "ready"
        slot = first.headers["x-sie-slot"]
        for turn in range(3):
            messages.append({"role": "user", "content": f"turn {turn} " * 50})
            r = await p.client.post(
                "/v1/chat/completions", json={"model": "a", "messages": messages}
            )
            assert (r.headers["x-sie-slot"], r.headers["x-sie-route-reason"]) == (slot, "prefix")
        assert (
            p.app.state.table.metrics.registry.get_sample_value(
                "sie_router_decisions_total", {"reason": "prefix"}
            )
            == 3.0
        )
        # A short prompt (no full block) and a completion go the usual way.
        r = await _complete(p.client, "a")
        assert r.headers["x-sie-route-reason"] == "ready"
