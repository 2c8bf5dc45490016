"""A load shows as loading from the moment the worker takes it, before any placement."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx
import pytest
from tests.support.worker_fixtures import fake_model

from sie_worker.config.files.reader import parse_config
from sie_worker.errors import InvalidConfig
from sie_worker.settings import Settings
from sie_worker.worker import loading
from sie_worker.worker.manager import ModelManager
from sie_worker.worker.metrics import WorkerMetrics
from sie_worker.worker.placement.memory import device_memory

_ENV = {"SIE_DEVICES": "cuda:0", "SIE_BUNDLE": "sglang", "SIE_WEIGHTS_DOWNLOAD": "engine"}


def test_a_model_is_loading_while_its_options_resolve_and_failed_when_they_cannot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    entered, release = threading.Event(), threading.Event()

    def slow_refusal(served: Any, settings: Settings) -> Any:
        entered.set()
        release.wait(timeout=30)
        raise InvalidConfig([], headline="the options of org/slow do not resolve")

    monkeypatch.setattr(loading, "resolve_load_options", slow_refusal)

    async def scenario() -> None:
        settings = Settings.from_env(_ENV, gpu=True)
        memory = device_memory(settings, _ENV)
        metrics = WorkerMetrics(settings.devices, memory.totals, memory.budgets())
        config = parse_config(fake_model("org/slow"), source=None)
        async with httpx.AsyncClient() as client:
            manager = ModelManager(
                settings, client, metrics, {config.sie_id: config}, base_env=_ENV, memory=memory
            )
            record = manager.record("org/slow")
            load = asyncio.create_task(manager.load("org/slow"))
            assert await asyncio.to_thread(entered.wait, 30)
            # Nothing is placed yet, and the model already says it is on its way.
            assert (record.state, record.phase, record.block) == ("loading", "starting", ())
            assert manager.model_entry(record)["state"] == "loading"
            release.set()
            with pytest.raises(InvalidConfig):
                await load
            assert record.state == "failed"
            assert "do not resolve" in (record.error or "")
            await manager.shutdown()

    asyncio.run(scenario())
