"""The pod's model-server series on the router's /metrics: its workers' summed and joined."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import anyio
import httpx
import pytest

from sie_worker.model_server_series import ServerLoad, parse, render
from sie_worker.router.app import create_router_app
from sie_worker.router.model_server_metrics import READ_TIMEOUT_S, pod_series, read_timeout
from sie_worker.router.settings import RouterSettings

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


A = ServerLoad(
    waiting=1,
    running=2,
    kv_usage=0.5,
    ready=frozenset({"org/a", "org/b"}),
    loading=frozenset({"org/c"}),
    max_lora=2,
)
B = ServerLoad(waiting=3, running=1, kv_usage=0.25, ready=frozenset({"org/c"}), max_lora=1)


def _workers(metrics: Mapping[int, httpx.Response | Exception]) -> httpx.MockTransport:
    """Workers on 127.0.0.1:<port>: each answers polls (ready) and /metrics as given."""

    def answer(request: httpx.Request) -> httpx.Response:
        path, port = request.url.path, request.url.port or 0
        if path == "/metrics":
            got = metrics[port]
            if isinstance(got, Exception):
                raise got
            return got
        if path == "/v1/models":
            return httpx.Response(200, json={"data": []})
        if path == "/v1/devices":
            return httpx.Response(200, json={"devices": [{"device": "cuda:0", "models": []}]})
        return httpx.Response(200, json={"status": "ready"})  # /readyz

    return httpx.MockTransport(answer)


def _text(load: ServerLoad) -> httpx.Response:
    return httpx.Response(200, content=render(load))


@dataclass(frozen=True)
class _Slot:
    url: str
    up: bool = True


async def test_workers_loads_combine_and_one_that_fails_is_left_out() -> None:
    # slot 5 is down: not asked at all (its port has no answer here)
    slots = [_Slot(f"http://127.0.0.1:{p}", up=p != 5) for p in (1, 2, 3, 4, 5)]
    transport = _workers(
        {
            1: _text(A),
            2: _text(B),
            3: httpx.ConnectError("refused"),
            4: httpx.Response(200, text="# TYPE sie_models gauge\nsie_models 1\n"),
        }
    )
    async with httpx.AsyncClient(transport=transport) as client:
        text = await pod_series(client, slots, {})

    # org/c is ready on the second worker: the pod runs it, whatever the first one does
    assert parse(text.decode()) == ServerLoad(
        waiting=4,
        running=3,
        kv_usage=0.5,
        ready=frozenset({"org/a", "org/b", "org/c"}),
        max_lora=3,
    )


async def test_a_pod_whose_workers_do_not_answer_reports_zeros() -> None:
    async with httpx.AsyncClient(transport=_workers({})) as client:
        text = await pod_series(client, [], {})

    assert parse(text.decode()) == ServerLoad()


async def test_the_routers_metrics_serve_its_own_series_and_the_pods() -> None:
    settings = RouterSettings(worker_ports=(9001, 9002), poll_interval_s=0.05, poll_timeout_s=1)
    transport = _workers({9001: _text(A), 9002: _text(B)})
    async with httpx.AsyncClient(transport=transport) as workers:
        app = create_router_app(settings, client=workers)
        async with app.router.lifespan_context(app):
            asgi = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=asgi, base_url="http://r") as router:
                with anyio.fail_after(10):
                    while not all(s.up for s in app.state.table.slots):  # noqa: ASYNC110 - polls set no event
                        await anyio.sleep(0.02)
                response = await router.get("/metrics")

    assert response.status_code == 200
    assert "sie_router_slots 2.0" in response.text
    load = parse(response.text)
    assert load is not None
    assert (load.waiting, load.running, load.kv_usage, load.max_lora) == (4, 3, 0.5, 3)
    assert response.text.count("# TYPE sie_worker_lora_requests_info gauge") == 1


def test_workers_are_read_within_half_the_scrape_timeout_prometheus_announces() -> None:
    header = "X-Prometheus-Scrape-Timeout-Seconds"
    assert read_timeout({header.lower(): "0.9"}) == 0.45
    assert read_timeout({header.lower(): "30"}) == READ_TIMEOUT_S
    assert read_timeout({}) == READ_TIMEOUT_S
    assert read_timeout({header.lower(): "soon"}) == READ_TIMEOUT_S
