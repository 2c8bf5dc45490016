"""Loads that start together never hand the same port to two engines.

Found by the load storm: a port passes the bind test until its engine binds it, so two loads
starting at once could both pick it; the loser then retried on a new HTTP port but kept the
same rendezvous port, and failed with ``load_failed`` after three tries. Here every port scan
starts at the first port of its range, so the collision is certain without the reservation.
"""

from __future__ import annotations

import asyncio
import os
import random
import shlex
import socket

import httpx
import pytest
from sie_worker.config.files.reader import parse_config
from sie_worker.settings import Settings
from sie_worker.worker.launcher import ports
from sie_worker.worker.launcher.process import EngineProcess, PortInUse
from sie_worker.worker.manager import ModelManager
from sie_worker.worker.metrics import WorkerMetrics
from sie_worker.worker.placement.memory import device_memory

from tests.support.engine_fixtures import FakeEngineFactory
from tests.support.worker_fixtures import fake_model

_MODELS = ("org/a", "org/b", "org/c")


class _FirstPort(random.Random):
    def randrange(self, *args: object, **kwargs: object) -> int:  # type: ignore[override]
        return 0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_loads_starting_together_get_distinct_engine_and_rendezvous_ports(
    fake_engine_minimal_command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ports, "random", _FirstPort())  # every scan starts at the first port
    settings = Settings.from_env(
        {
            "SIE_DEVICES": "cuda:0,cuda:1,cuda:2",
            "SIE_BUNDLE": "sglang",
            "SIE_SGLANG_COMMAND": fake_engine_minimal_command,
            "SIE_ENGINE_STOP_GRACE_S": "5",
            "SIE_WEIGHTS_DOWNLOAD": "engine",  # the fake engine needs no weights
        },
        gpu=False,
    )
    configs = {m: parse_config(fake_model(m), source=None) for m in _MODELS}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SIE_", "FAKE_"))}
    env["FAKE_ENGINE_MAX_LIFETIME_S"] = "300"
    async with httpx.AsyncClient(trust_env=False) as client:
        memory = device_memory(settings, env)
        metrics = WorkerMetrics(settings.devices, memory.totals, memory.budgets())
        manager = ModelManager(settings, client, metrics, configs, base_env=env, memory=memory)
        try:
            entries = await asyncio.gather(*(manager.load(m) for m in _MODELS))
            assert [e["state"] for e in entries] == ["ready"] * 3
            running = [manager.records[m].running for m in _MODELS]
            taken = [p for r in running if r for p in (r.engine.port, r.nccl_port)]
            assert len(taken) == 6
            assert len(set(taken)) == 6, taken
            for run in running:
                assert run is not None
                info = (await client.get(run.engine.base_url + "/_fake/info")).json()
                assert info["nccl_port"] == run.nccl_port
        finally:
            await manager.shutdown()


@pytest.mark.anyio
async def test_a_health_answer_from_another_process_on_the_engine_port_is_not_readiness(
    fake_engine_factory: FakeEngineFactory, fake_engine_minimal_command: str
) -> None:
    # Another worker's engine took the port after our bind test and answers /health.
    other = fake_engine_factory()
    argv = [
        *shlex.split(fake_engine_minimal_command),
        *("--model-path", "org/m", "--served-model-name", "org/m"),
        *("--host", "127.0.0.1", "--port", str(other.port)),
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SIE_", "FAKE_"))}
    engine = await EngineProcess.start("org/m", argv, env, other.port)
    try:
        async with httpx.AsyncClient(trust_env=False) as client:
            with pytest.raises(PortInUse):
                await engine.wait_ready(client, "/health", timeout_s=30)
    finally:
        await engine.stop(5)
    assert other.info()["served_model_name"] == "fake/model"  # untouched, still serving


def test_a_port_whose_last_connections_are_in_time_wait_is_free_for_an_engine() -> None:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    served, _ = listener.accept()
    served.close()  # the engine closes first: its side of the connection enters TIME_WAIT
    client.recv(1)
    client.close()
    listener.close()  # the engine is gone; only TIME_WAIT is left on the port
    engine = socket.socket()
    engine.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    engine.bind(("127.0.0.1", port))  # a new engine can take it (as uvicorn would) ...
    engine.close()
    assert ports.port_is_free(port)  # ... so the worker must not count it as taken
