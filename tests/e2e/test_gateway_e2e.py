"""A fleet on one machine: two pools of two pods each (a ``sie-worker route`` process in
front of ``sie-worker serve`` processes on fake SGLang engines), a third pool at zero
replicas, and ``sie-worker gateway`` in front of them, all over 127.0.0.1 sockets.

- pool ``l4`` (bundle sglang, machine profile l4, GPU type l4): pods of one 1-GPU slot;
- pool ``l4-4x`` (machine profile l4-4x, GPU type l4): pods of one 2-GPU slot;
- pool ``spare`` (machine profile a10): no endpoint until a test adds one.

``org/small`` fits every pool, ``org/wide`` (tensor_parallel_size 2) only ``l4-4x``.

The tests that only route requests share one fleet (``shared_fleet``, the module's: five
processes and four fake engines started once instead of once a test) and run in the order
written, each leaving it as the next one expects: the first finds nothing loaded, the next
ones add ``org/small`` on one ``l4`` pod and ``org/wide`` on one ``l4-4x`` pod. A test that
kills a pod, stops the gateway, changes its pools or its settings has a fleet of its own.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import loopback
from tests.support.gateway_fixtures import GatewayProcess, PodProcess
from tests.support.sie_sdk import SdkRunner
from tests.support.worker_fixtures import fake_model, wait_until, write_config

pytestmark = pytest.mark.slow

MODELS = [
    fake_model("org/small", env={"FAKE_ENGINE_START_DELAY_S": "0.5"}),
    fake_model("org/wide", width=2, env={"FAKE_ENGINE_START_DELAY_S": "0.5"}),
]


@dataclass
class Fleet:
    gateway: GatewayProcess
    pods: dict[str, list[PodProcess]]
    pools: list[dict[str, Any]]
    start_pod: Callable[..., PodProcess]

    def client(self) -> httpx.Client:
        return self.gateway.client()

    def pod_named(self, name: str) -> PodProcess:
        pool, _, index = name.rpartition("-sglang-")
        return self.pods[pool][int(index)]

    def add_endpoint(self, pool: str, pod: PodProcess) -> None:
        for entry in self.pools:
            if entry["pool"] == pool:
                entry["endpoints"] = [*entry["endpoints"], pod.url]
        self.gateway.write_pools(self.pools)


def _pools(pods: dict[str, list[PodProcess]]) -> list[dict[str, Any]]:
    def entry(pool: str, profile: str, gpu_type: str, width: int) -> dict[str, Any]:
        return {
            "pool": pool,
            "bundle": "sglang",
            "machine_profile": profile,
            "gpu_type": gpu_type,
            "slots": 1,
            "slot_width": width,
            "endpoints": [p.url for p in pods.get(pool, [])],
        }

    return [
        entry("l4", "l4", "l4", 1),
        entry("l4-4x", "l4-4x", "l4", 2),
        entry("spare", "a10", "a10", 2),
    ]


def _config_dir(directory: Path) -> Path:
    directory.mkdir()
    for config in MODELS:
        write_config(directory, config)
    return directory


def _make_fleet(
    start_pod: Callable[..., PodProcess],
    start_gateway: Callable[..., GatewayProcess],
    config_dir: Path,
    **env: str,
) -> Fleet:
    with ThreadPoolExecutor(4) as pool:
        small = [pool.submit(start_pod, MODELS, devices="cuda:0") for _ in range(2)]
        wide = [pool.submit(start_pod, MODELS, devices="cuda:0,cuda:1") for _ in range(2)]
        pods = {"l4": [f.result() for f in small], "l4-4x": [f.result() for f in wide]}
    pools = _pools(pods)
    gateway = start_gateway(pools, env=env, config_dir=config_dir)
    fleet = Fleet(gateway, pods, pools, start_pod)
    wait_until(lambda: _ready_pods(fleet) == 4, timeout=30)
    return fleet


@pytest.fixture
def make_fleet(
    start_pod: Callable[..., PodProcess],
    start_gateway: Callable[..., GatewayProcess],
    tmp_path: Path,
) -> Callable[..., Fleet]:
    config_dir = _config_dir(tmp_path / "gateway-models")
    return lambda **env: _make_fleet(start_pod, start_gateway, config_dir, **env)


@pytest.fixture
def fleet(make_fleet: Callable[..., Fleet]) -> Fleet:
    return make_fleet(SIE_GATEWAY_HOLD_S="30")


@pytest.fixture(scope="module")
def shared_fleet(
    module_start_pod: Callable[..., PodProcess],
    module_start_gateway: Callable[..., GatewayProcess],
    tmp_path_factory: pytest.TempPathFactory,
) -> Fleet:
    """The fleet of the tests that only route requests, in the order they are written."""
    config_dir = _config_dir(tmp_path_factory.mktemp("shared-fleet") / "gateway-models")
    return _make_fleet(module_start_pod, module_start_gateway, config_dir, SIE_GATEWAY_HOLD_S="30")


def _ready_pods(fleet: Fleet) -> int:
    health = loopback.get(fleet.gateway.url + "/health", timeout=5).json()
    return sum(1 for w in health["workers"] if w["healthy"])


def _complete(
    client: httpx.Client, model: str, headers: dict[str, str] | None = None, **fields: Any
) -> httpx.Response:
    body = {"model": model, "prompt": "hello fleet", "max_tokens": 4, **fields}
    return client.post("/v1/completions", json=body, headers=headers or {})


_SDK_CAPACITY = """
client = SIEClient(url)
result = {"all": client.get_capacity(), "wide": client.get_capacity(gpu="L4-4X")}
"""


def test_models_union_and_cluster_health_cover_every_pool(shared_fleet: Fleet) -> None:
    with shared_fleet.client() as client:
        assert _complete(client, "org/wide").status_code == 200
        models = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
        health = client.get("/health").json()
    assert models["org/wide"]["state"] == "ready"
    assert {p["pool"] for p in models["org/small"]["pools"]} == {"l4", "l4-4x"}
    assert len(models["org/small"]["pools"]) == 4
    assert health["type"] == "gateway"
    assert health["status"] == "healthy"
    assert health["cluster"] == {"worker_count": 4, "gpu_count": 4, "models_loaded": 1}
    assert health["configured_gpu_types"] == ["a10", "l4", "l4-4x"]
    assert health["live_gpu_types"] == ["l4", "l4-4x"]
    assert {w["gpu"] for w in health["workers"]} == {"l4", "l4-4x"}
    assert health["models"][0]["name"] == "org/wide"


def test_unknown_pool_is_404_naming_the_pools_and_a_misfit_is_409(shared_fleet: Fleet) -> None:
    with shared_fleet.client() as client:
        unknown = _complete(client, "org/small", {"X-SIE-Pool": "h100"})
        profile = _complete(client, "org/small", {"X-SIE-MACHINE-PROFILE": "h100-8x"})
        misfit = _complete(client, "org/wide", {"X-SIE-Pool": "l4"})
    assert unknown.status_code == 404
    assert unknown.headers["x-sie-error-code"] == "POOL_NOT_FOUND"
    error = unknown.json()["error"]
    assert error["code"] == "unknown_pool"
    assert all(name in error["message"] for name in ("l4 (", "l4-4x (", "spare ("))
    assert profile.json()["error"]["code"] == "unknown_pool"
    assert misfit.status_code == 409
    assert misfit.json()["error"]["code"] == "no_pool"
    assert "needs 2 GPUs per slot" in misfit.json()["error"]["message"]


def test_sdk_get_capacity_reads_cluster_health(shared_fleet: Fleet, sie_sdk: SdkRunner) -> None:
    capacity = sie_sdk.run(_SDK_CAPACITY, url=shared_fleet.gateway.url)
    assert capacity["all"]["status"] == "healthy"
    assert capacity["all"]["worker_count"] == 4
    assert capacity["all"]["gpu_count"] == 4
    assert capacity["wide"]["worker_count"] == 2
    assert {w["gpu"] for w in capacity["wide"]["workers"]} == {"l4-4x"}
    assert all(w["healthy"] for w in capacity["all"]["workers"])


def test_machine_profile_and_pool_headers_pick_the_pool(shared_fleet: Fleet) -> None:
    with shared_fleet.client() as client:
        by_profile = _complete(client, "org/small", {"X-SIE-MACHINE-PROFILE": "l4-4x"})
        by_pool = _complete(client, "org/small", {"X-SIE-Pool": "L4"})
        # "l4" is the machine profile of pool l4 and only the GPU type of l4-4x.
        by_type = _complete(client, "org/small", {"X-SIE-MACHINE-PROFILE": "l4"})
        wide = _complete(client, "org/wide")
    assert (by_profile.status_code, by_profile.headers["x-sie-pool"]) == (200, "l4-4x")
    assert (by_pool.status_code, by_pool.headers["x-sie-pool"]) == (200, "l4")
    assert (by_type.status_code, by_type.headers["x-sie-pool"]) == (200, "l4")
    assert (wide.status_code, wide.headers["x-sie-pool"]) == (200, "l4-4x")
    assert by_profile.json()["choices"][0]["text"]


def test_second_request_for_a_model_goes_to_the_pod_that_has_it(shared_fleet: Fleet) -> None:
    headers = {"X-SIE-Pool": "l4"}
    with shared_fleet.client() as client:
        first = _complete(client, "org/small", headers)
        later = [_complete(client, "org/small", headers) for _ in range(4)]
    assert first.status_code == 200
    home = first.headers["x-sie-pod"]
    assert {r.headers["x-sie-pod"] for r in later} == {home}
    assert {r.headers["x-sie-pod-reason"] for r in later} == {"ready"}
    other = next(p for p in shared_fleet.pods["l4"] if p is not shared_fleet.pod_named(home))
    assert other.workers[0].models()["org/small"]["state"] == "unloaded"


def test_streams_and_request_ids_pass_through(shared_fleet: Fleet) -> None:
    body = {"model": "org/wide", "stream": True, "prompt": "one two three", "max_tokens": 5}
    with shared_fleet.client() as client:
        with client.stream(
            "POST", "/v1/completions", json=body, headers={"X-Request-Id": "req-42"}
        ) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            assert r.headers["x-request-id"] == "req-42"
            events = [line for line in r.iter_lines() if line.startswith("data: ")]
        generated = _complete(client, "org/wide")
    assert events[-1] == "data: [DONE]"
    assert len(events) == 5 + 1  # every token (the last with the finish reason), [DONE]
    assert generated.headers["x-request-id"]


def test_session_sticks_to_its_pod_until_its_load_passes_the_bound(
    make_fleet: Callable[..., Fleet],
) -> None:
    fleet = make_fleet(SIE_GATEWAY_SLOT_TARGET="1")
    session = {"X-SIE-Pool": "l4", "X-Session-Id": "agent-7"}
    with fleet.client() as client:
        first = _complete(client, "org/small", session)
        home = first.headers["x-sie-pod"]
        again = [_complete(client, "org/small", session) for _ in range(3)]
        assert {r.headers["x-sie-pod"] for r in again} == {home}
        assert {r.headers["x-sie-pod-reason"] for r in again} == {"affinity"}
        # Two slow streams of the session keep its pod busy: 2 in flight is over
        # ceil(1.25 x (2 + 1) / 2) = 2 with the next one, so the session spills.
        slow = {"stream": True, "max_tokens": 400, "fake": {"token_delay_s": 0.05}}
        streams = [
            client.stream(
                "POST",
                "/v1/completions",
                json={"model": "org/small", **slow, "prompt": "x"},
                headers=session,
            )
            for _ in range(2)
        ]
        responses = [s.__enter__() for s in streams]
        try:
            assert [r.headers["x-sie-pod"] for r in responses] == [home, home]
            spilled = _complete(client, "org/small", session)
        finally:
            for s in streams:
                s.__exit__(None, None, None)
        assert spilled.status_code == 200
        assert spilled.headers["x-sie-pod"] != home
        assert spilled.headers["x-sie-pod-reason"] == "affinity_spill"
        wait_until(lambda: fleet.gateway.metric(_inflight("l4")) == 0, timeout=20)
        back = _complete(client, "org/small", session)
    assert (back.headers["x-sie-pod"], back.headers["x-sie-pod-reason"]) == (home, "affinity")


def _inflight(pool: str) -> str:
    return f'sie_gateway_inflight_requests{{bundle="sglang",pool="{pool}"}}'


def _pending(pool: str) -> str:
    return f'sie_gateway_pending_requests{{bundle="sglang",pool="{pool}"}}'


def test_pool_without_endpoint_holds_a_request_until_a_pod_appears(fleet: Fleet) -> None:
    spare = fleet.start_pod(MODELS, devices="cuda:0,cuda:1")
    result: list[httpx.Response] = []

    def send() -> None:
        with fleet.client() as client:
            result.append(_complete(client, "org/small", {"X-SIE-MACHINE-PROFILE": "a10"}))

    thread = threading.Thread(target=send)
    thread.start()
    try:
        wait_until(lambda: fleet.gateway.metric(_pending("spare")) == 1, timeout=20)
        assert not result
        fleet.add_endpoint("spare", spare)
    finally:
        thread.join(timeout=60)
    assert result[0].status_code == 200, result[0].text
    assert result[0].headers["x-sie-pool"] == "spare"
    assert fleet.gateway.metric(_pending("spare")) == 0
    served = 'sie_gateway_held_requests_total{bundle="sglang",outcome="served",pool="spare"}'
    assert fleet.gateway.metric(served) == 1


_SDK_CHAT = """
client = SIEClient(url, timeout_s=60)
result = client.chat_completions(
    "org/small", [{"role": "user", "content": "hi"}], max_tokens=4, gpu=gpu,
    provision_timeout_s=60,
)
"""


def test_expired_hold_is_503_provisioning_and_the_sdk_retry_then_succeeds(
    make_fleet: Callable[..., Fleet], sie_sdk: SdkRunner
) -> None:
    fleet = make_fleet(SIE_GATEWAY_HOLD_S="1", SIE_GATEWAY_RETRY_AFTER_S="1")
    with fleet.client() as client:
        started = time.monotonic()
        expired = _complete(client, "org/small", {"X-SIE-Pool": "spare"})
        held_for = time.monotonic() - started
    assert expired.status_code == 503
    assert expired.headers["x-sie-error-code"] == "PROVISIONING"
    assert expired.headers["retry-after"] == "1"
    assert expired.json()["error"]["code"] == "provisioning"
    assert held_for >= 1.0
    outcomes = (
        'sie_gateway_held_requests_total{bundle="sglang",outcome="provisioning",pool="spare"}'
    )
    spare = fleet.start_pod(MODELS, devices="cuda:0,cuda:1")
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(
            sie_sdk.run, _SDK_CHAT, timeout=120, url=fleet.gateway.url, gpu="spare/"
        )
        wait_until(lambda: fleet.gateway.metric(_pending("spare")) == 1, timeout=30)
        # The SDK's own request expired too (a second 503 provisioning): it retries, and the
        # pod that appears now answers the retry. Waited on, not slept for: a busy machine
        # took longer than any fixed pause.
        wait_until(lambda: fleet.gateway.metric(outcomes) >= 2, timeout=60)
        fleet.add_endpoint("spare", spare)
        chat = answer.result(timeout=120)
    assert chat["object"] == "chat.completion"
    assert fleet.gateway.metric(outcomes) >= 2


def test_killed_pod_is_routed_around(fleet: Fleet) -> None:
    headers = {"X-SIE-Pool": "l4"}
    with fleet.client() as client:
        first = _complete(client, "org/small", headers)
        victim = fleet.pod_named(first.headers["x-sie-pod"])
        victim.router.kill()
        victim.router.wait()
        again = _complete(client, "org/small", headers)
        assert again.status_code == 200, again.text
        assert again.headers["x-sie-pod"] != first.headers["x-sie-pod"]
        health = client.get("/health").json()
    down = next(w for w in health["workers"] if w["name"] == first.headers["x-sie-pod"])
    assert down["healthy"] is False
    assert health["cluster"]["worker_count"] == 3


def test_sigterm_answers_held_requests_and_exits_cleanly(fleet: Fleet) -> None:
    result: list[httpx.Response] = []

    def send() -> None:
        with fleet.client() as client:
            result.append(_complete(client, "org/small", {"X-SIE-Pool": "spare"}))

    thread = threading.Thread(target=send)
    thread.start()
    wait_until(lambda: fleet.gateway.metric(_pending("spare")) == 1, timeout=20)
    fleet.gateway.process.send_signal(signal.SIGTERM)
    thread.join(timeout=30)
    assert result[0].status_code == 503
    assert result[0].headers["x-sie-error-code"] == "PROVISIONING"
    assert "shutting down" in json.loads(result[0].text)["error"]["message"]
    assert fleet.gateway.process.wait(timeout=30) == 0
