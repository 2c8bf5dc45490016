"""The gateway over real sockets (uvicorn on 127.0.0.1, pods in the test's event loop):
where a request goes when pools differ in slot width, and its stream relay."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from tests.support.asgi_server import TcpFront, serve
from tests.support.fake_pod import FakePod, gateway_before

from sie_worker.gateway.pools import PoolSpec

pytestmark = pytest.mark.anyio

WIDE = {"model": "org/wide", "prompt": "x", "stream": True}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@asynccontextmanager
async def two_pools(
    tmp_path: Path, **settings: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, FakePod, FakePod, TcpFront]]:
    """Pool ``l4`` (one pod of four 1-GPU slots) and pool ``l4-4x`` (one pod, one 4-GPU
    slot, behind a front that can refuse connections like a killed router); both list
    ``org/wide`` (width 2), ready on the wide pod only."""
    small = FakePod({"org/wide": "unloaded"}, {"org/wide": 2}, slots=4, slot_width=1)
    wide = FakePod({"org/wide": "ready"}, {"org/wide": 2}, slots=1, slot_width=4)
    async with (
        serve(small.app(), lifespan="off") as small_port,
        serve(wide.app(), lifespan="off") as wide_port,
    ):
        front = TcpFront(wide_port)
        await front.start()
        specs = [
            PoolSpec("l4", "sglang", "l4", "l4", slots=4, slot_width=1,
                     endpoints=(f"http://127.0.0.1:{small_port}",)),
            PoolSpec("l4-4x", "sglang", "l4-4x", "l4", slots=1, slot_width=4,
                     endpoints=(f"http://127.0.0.1:{front.port}",)),
        ]  # fmt: skip
        try:
            async with gateway_before(specs, tmp_path, **settings) as client:
                yield client, small, wide, front
        finally:
            await front.close()


async def _healthy(client: httpx.AsyncClient) -> dict[str, bool]:
    health = (await client.get("/health")).json()
    return {w["name"]: w["healthy"] for w in health["workers"]}


async def _until_healthy(client: httpx.AsyncClient, **expected: bool) -> None:
    """Wait until the gateway's cluster health shows every pod (``expected``: those named,
    with ``_`` for ``-``) as healthy as said."""
    while True:
        healthy = await _healthy(client)
        wanted = {k.replace("_", "-"): v for k, v in expected.items()} or dict.fromkeys(
            healthy, True
        )
        if all(healthy.get(name) == value for name, value in wanted.items()):
            return
        await anyio.sleep(0.05)


async def test_a_wide_model_is_held_not_sent_to_narrow_slots_when_its_pod_is_down(
    tmp_path: Path,
) -> None:
    async with two_pools(tmp_path, hold_s=10.0) as (client, small, wide, front):
        with anyio.fail_after(20):
            await _until_healthy(client)
            first = await client.post("/v1/completions", json=WIDE)
            assert (first.status_code, first.headers["x-sie-pod"]) == (200, "l4-4x-sglang-0")
            await front.refuse()  # the wide pod's router is killed
            await _until_healthy(client, l4_4x_sglang_0=False)
            async with anyio.create_task_group() as tg:
                answers: list[httpx.Response] = []

                async def send() -> None:
                    answers.append(await client.post("/v1/completions", json=WIDE))

                tg.start_soon(send)
                await anyio.sleep(0.5)
                assert not answers  # held: no pod that can hold the model is ready
                await front.accept()  # the router is back
        assert answers[0].status_code == 200, answers[0].text
        assert answers[0].headers["x-sie-pod"] == "l4-4x-sglang-0"
    assert small.requests == []
    assert len(wide.requests) == 2


async def test_a_retry_never_goes_to_slots_narrower_than_the_model(tmp_path: Path) -> None:
    # Polls far apart: the gateway learns that the pod is gone from the refused try.
    async with two_pools(tmp_path, poll_interval_s=30.0, hold_s=0.5) as (client, small, _, front):
        with anyio.fail_after(20):
            await _until_healthy(client)
            await front.refuse()
            answer = await client.post("/v1/completions", json=WIDE)
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"]["code"] == "provisioning"
    assert small.requests == []


async def test_a_pool_named_for_a_model_wider_than_its_slots_is_409_no_pool(
    tmp_path: Path,
) -> None:
    async with two_pools(tmp_path) as (client, small, _, _):
        with anyio.fail_after(20):
            await _until_healthy(client)
            answer = await client.post("/v1/completions", json=WIDE, headers={"X-SIE-Pool": "l4"})
    assert answer.status_code == 409
    error = answer.json()["error"]
    assert error["code"] == "no_pool"
    assert "needs 2 GPUs per slot and the pool's slots have 1" in error["message"]
    assert small.requests == []


async def test_the_gateway_relays_a_stream_event_by_event(tmp_path: Path) -> None:
    async with two_pools(tmp_path) as (client, _, wide, _):
        wide.events, wide.paced_s = 5, 0.01
        with anyio.fail_after(20):
            await _until_healthy(client)
            async with client.stream("POST", "/v1/completions", json=WIDE) as r:
                assert r.headers["transfer-encoding"] == "chunked"
                lines = [line async for line in r.aiter_lines() if line]
    assert [json.loads(line[6:])["n"] for line in lines[:-1]] == [0, 1, 2, 3, 4]
    assert lines[-1] == "data: [DONE]"
