"""A lease counts its request in flight until released, and its release records the
request's status and duration exactly once."""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

from sie_worker.config.files.reader import parse_config
from sie_worker.config.load.load_options import LoadOptions
from sie_worker.config.model import served_model
from sie_worker.worker.launcher.process import EngineProcess
from sie_worker.worker.launcher.start import RunningEngine
from sie_worker.worker.metrics import WorkerMetrics
from sie_worker.worker.proxy import open_lease
from sie_worker.worker.records import ModelRecord


class _Engine:
    port = 30001
    base_url = "http://127.0.0.1:30001"


def _running() -> RunningEngine:
    options = LoadOptions(
        width=1,
        request_read_timeout_s=7.0,
        startup_timeout_s=900.0,
        watchdog_timeout_s=None,
        disable_piecewise_cuda_graph=False,
        nccl_port=None,
        extras={},
    )
    return RunningEngine(cast(EngineProcess, _Engine()), options, nccl_port=30401)


def _record() -> ModelRecord:
    config = parse_config(
        {"sie_id": "org/m", "hf_id": "org/m", "tasks": {"encode": {}}, "profiles": {"default": {}}},
        source=None,
    )
    return ModelRecord(served_model(config, "default"), state="ready")


def _count(metrics: WorkerMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def _lease_twice_released() -> tuple[Any, ...]:
    metrics, record, running = WorkerMetrics(["cpu"]), _record(), _running()
    lease = open_lease(record, running, metrics, started=time.monotonic() - 2.0)
    inflight = _count(metrics, "sie_inflight_requests", model="org/m")
    during = (running.inflight, running.idle.is_set(), inflight)
    lease.status = "200"
    lease.release()
    lease.release()
    after = (running.inflight, running.idle.is_set())
    count = _count(
        metrics, "sie_request_duration_seconds_count", model="org/m", code="200", adapter="none"
    )
    total = _count(
        metrics, "sie_request_duration_seconds_sum", model="org/m", code="200", adapter="none"
    )
    return during, after, count, total, lease


def test_a_lease_is_in_flight_until_released_and_observed_once() -> None:
    during, after, count, total, lease = asyncio.run(_lease_twice_released())
    assert during == (1, False, 1.0)
    assert after == (0, True)
    assert count == 1.0
    assert total >= 2.0
    assert (lease.model, lease.base_url, lease.read_timeout_s) == (
        "org/m",
        "http://127.0.0.1:30001",
        7.0,
    )


def test_running_engine_holds_its_http_and_rendezvous_ports() -> None:
    assert asyncio.run(_ports()) == {30001, 30401}


async def _ports() -> set[int]:
    return _running().ports
