"""The gateway's series: those alerts read exist at zero per pool, and the oldest hold's age."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sie_worker.errors import Provisioning
from sie_worker.gateway.metrics import ANSWER_CODES, HOLD_OUTCOMES, GatewayMetrics
from sie_worker.gateway.pools import PoolKey, PoolSpec
from sie_worker.gateway.routing import Holder, Selection
from sie_worker.gateway.settings import GatewaySettings
from sie_worker.gateway.state import Fleet

L4 = PoolSpec("l4", "sglang", "l4", "l4", service="a", port=1)
CPU = PoolSpec("cpu", "default", "cpu", "cpu", service="c", port=1)


def _samples(metrics: GatewayMetrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = generate_latest(metrics.registry).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _pool(key: PoolKey, **more: str) -> frozenset[tuple[str, str]]:
    return frozenset({"pool": key.pool, "bundle": key.bundle, **more}.items())


def test_every_pools_counters_and_histograms_exist_at_zero_before_any_request() -> None:
    samples = _samples(GatewayMetrics([L4.key, CPU.key]))

    for key in (L4.key, CPU.key):
        for code in ANSWER_CODES:
            assert samples[("sie_gateway_requests_total", _pool(key, code=code))] == 0.0
        for outcome in HOLD_OUTCOMES:
            assert samples[("sie_gateway_held_requests_total", _pool(key, outcome=outcome))] == 0
        assert samples[("sie_gateway_hold_seconds_count", _pool(key))] == 0.0
        assert samples[("sie_gateway_request_duration_seconds_count", _pool(key))] == 0.0
        assert samples[("sie_gateway_oldest_held_seconds", _pool(key))] == 0.0


def test_the_answer_codes_are_200_and_every_error_codes_status() -> None:
    assert ANSWER_CODES[0] == "200"
    assert {"400", "404", "409", "429", "502", "503", "504"} <= set(ANSWER_CODES)
    assert "500" not in ANSWER_CODES


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_oldest_held_requests_age_grows_while_held_and_drops_to_zero_after() -> None:
    metrics = GatewayMetrics([L4.key])
    # A hold far longer than the test: the holds end when drained, not by a deadline a slow
    # machine could pass before the ages are read.
    fleet = Fleet(GatewaySettings(Path("p.yaml"), hold_s=60), (L4,), metrics)
    holder = Holder(fleet)
    ages: list[float] = []

    async def pick() -> None:
        with pytest.raises(Provisioning):
            await holder.pick(Selection("m", 1, (L4.key,)), frozenset())

    async with anyio.create_task_group() as tg:
        tg.start_soon(pick)
        await anyio.sleep(0.1)
        tg.start_soon(pick)  # a younger one: the oldest's age is what shows
        for _ in range(2):
            await anyio.sleep(0.05)
            ages.append(_samples(metrics)[("sie_gateway_oldest_held_seconds", _pool(L4.key))])
        holder.drain()

    # The first read comes about 0.15 s after the oldest began, 0.05 s after the younger.
    assert 0.1 <= ages[0] < ages[1] < 60
    samples = _samples(metrics)
    assert samples[("sie_gateway_oldest_held_seconds", _pool(L4.key))] == 0.0
    assert samples[("sie_gateway_hold_seconds_count", _pool(L4.key))] == 2.0
    outcome = _pool(L4.key, outcome="drained")
    assert samples[("sie_gateway_held_requests_total", outcome)] == 2.0
