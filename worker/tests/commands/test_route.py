"""``sie-worker route``: refusals of bad settings, and a real router process over sockets."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.abc
import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from tests.support.ports import free_port

from sie_worker.cli import main


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"SIE_WORKER_PORTS": "8081,8082", "SIE_GPU_COUNT": "4"}, "SIE_GPU_COUNT is 4"),
        ({"SIE_WORKER_PORTS": "8080"}, "--port 8080 is also a worker port"),
    ],
)
def test_route_refuses_bad_settings_with_a_message_naming_them(
    env: dict[str, str],
    fragment: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name in ("SIE_WORKER_PORTS", "SIE_GPU_COUNT", "SIE_WORKER_BASE_PORT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(["route", "--port", "8080"]) == 2
    assert fragment in capsys.readouterr().err


# -- a real router process ---------------------------------------------------------------


def _worker_app() -> Starlette:
    async def readyz(request: Request) -> Response:
        return JSONResponse({"status": "ready"})

    async def models(request: Request) -> Response:
        entry = {
            "id": "m",
            "object": "model",
            "state": "ready",
            "devices": ["cpu"],
            "width": 1,
            "pinned": False,
            "error": None,
        }
        return JSONResponse({"object": "list", "data": [entry]})

    async def devices(request: Request) -> Response:
        return JSONResponse({"devices": [{"device": "cpu", "model": "m"}]})

    async def completions(request: Request) -> Response:
        body = await request.json()
        return JSONResponse(
            {
                "object": "text_completion",
                "model": body["model"],
                "choices": [{"index": 0, "text": "hello"}],
            }
        )

    return Starlette(
        routes=[
            Route("/readyz", readyz),
            Route("/v1/models", models),
            Route("/v1/devices", devices),
            Route("/v1/completions", completions, methods=["POST"]),
        ]
    )


@asynccontextmanager
async def _serve(app: Starlette) -> AsyncIterator[int]:
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", ws="none")
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve)
        with anyio.fail_after(10):
            while not server.started:  # noqa: ASYNC110 - uvicorn offers no started event
                await anyio.sleep(0.01)
        try:
            yield server.servers[0].sockets[0].getsockname()[1]
        finally:
            server.should_exit = True


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_route_process_serves_probes_and_relays_then_exits_0_on_sigterm(
    anyio_backend: str, tmp_path: Path
) -> None:
    async with _serve(_worker_app()) as worker_port:
        port = free_port()
        env = {**os.environ, "SIE_WORKER_PORTS": str(worker_port), "SIE_GPU_COUNT": "1"}
        env.pop("SIE_API_KEY", None)
        log = (tmp_path / "route.log").open("wb")
        argv = [sys.executable, "-m", "sie_worker", "route", "--host", "127.0.0.1"]
        argv += ["--port", str(port), "--log-level", "warning"]
        proc = await anyio.open_process(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            async with httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=5
            ) as client:
                await _until_ready(client, proc)
                r = await client.post("/v1/completions", json={"model": "m", "prompt": "x"})
                assert r.status_code == 200
                assert r.json()["choices"][0]["text"] == "hello"
                assert "sie_router_slots 1.0" in (await client.get("/metrics")).text
            proc.send_signal(signal.SIGTERM)
            with anyio.fail_after(30):
                assert await proc.wait() == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            log.close()


async def _until_ready(client: httpx.AsyncClient, proc: anyio.abc.Process) -> None:
    with anyio.fail_after(30):
        while True:
            assert proc.returncode is None, "sie-worker route exited early"
            try:
                if (await client.get("/readyz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass  # not listening yet
            await anyio.sleep(0.1)
