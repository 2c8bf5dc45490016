"""Seed 000's placement rules, through the real HTTP API and real engine subprocesses."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from tests.support.worker_fixtures import WorkerProcess, fake_model

StartWorker = Callable[..., WorkerProcess]


def _consistent(worker: WorkerProcess) -> None:
    """``/v1/devices`` and ``/v1/models`` describe the same claims."""
    devices = worker.devices()
    claimed: dict[str, str] = {}
    for model in worker.models().values():
        for device in model["devices"]:
            assert device not in claimed, (
                f"{device} claimed by {claimed.get(device)} and {model['id']}"
            )
            claimed[device] = model["id"]
        if model["state"] in ("unloaded", "failed"):
            assert model["devices"] == []
    assert {d: m for d, m in devices.items() if m is not None} == claimed


def _load(worker: WorkerProcess, model_id: str) -> Any:
    with worker.client() as client:
        return client.post(f"/v1/models/{model_id}/load")


@pytest.mark.parametrize("count", [1, 2, 4, 8])
def test_width_above_device_count_is_refused_at_load(start_worker: StartWorker, count: int) -> None:
    worker = start_worker(
        [fake_model("org/too-wide", width=min(count * 2, 8) if count < 8 else 8)],
        devices=",".join(f"cuda:{i}" for i in range(count)),
    )
    response = _load(worker, "org/too-wide")
    if count == 8:
        assert response.status_code == 200
        assert response.json()["devices"] == [f"cuda:{i}" for i in range(8)]
        return
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_config"
    assert f"{count}" in error["message"]
    assert "tensor_parallel_size" in error["message"]
    assert all(m is None for m in worker.devices().values())


def test_width_4_is_refused_outright_on_two_devices(start_worker: StartWorker) -> None:
    worker = start_worker([fake_model("org/wide", width=4)], devices="cuda:0,cuda:1")
    response = _load(worker, "org/wide")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_config"
    assert worker.models()["org/wide"]["devices"] == []


def test_group_claims_a_contiguous_block_and_the_mask_follows(start_worker: StartWorker) -> None:
    worker = start_worker(
        [fake_model("org/one"), fake_model("org/two", width=2)],
        devices="cuda:0,cuda:1,cuda:2,cuda:3",
    )
    assert _load(worker, "org/one").json()["devices"] == ["cuda:0"]
    entry = _load(worker, "org/two").json()
    assert entry["state"] == "ready"
    assert entry["devices"] == ["cuda:1", "cuda:2"]
    assert entry["width"] == 2
    masks = _engine_masks(worker)
    assert masks["org/two"] == "1,2"
    assert masks["org/one"] == "0"
    _consistent(worker)


def test_width_2_model_and_its_width_2_profile_fit_side_by_side_on_four_devices(
    start_worker: StartWorker,
) -> None:
    config = fake_model("org/m", width=2, profiles={"fast": {"extends": "default"}})
    worker = start_worker([config], devices="cuda:0,cuda:1,cuda:2,cuda:3")
    assert _load(worker, "org/m").json()["devices"] == ["cuda:0", "cuda:1"]
    assert _load(worker, "org/m:fast").json()["devices"] == ["cuda:2", "cuda:3"]
    models = worker.models()
    assert models["org/m"]["state"] == "ready"
    assert models["org/m:fast"]["state"] == "ready"
    _consistent(worker)


def test_on_two_devices_loading_the_profile_evicts_the_model(start_worker: StartWorker) -> None:
    config = fake_model("org/m", width=2, profiles={"fast": {"extends": "default"}})
    worker = start_worker([config], devices="cuda:0,cuda:1")
    _load(worker, "org/m")
    entry = _load(worker, "org/m:fast").json()
    assert entry["devices"] == ["cuda:0", "cuda:1"]
    models = worker.models()
    assert models["org/m"]["state"] == "unloaded"
    assert models["org/m:fast"]["state"] == "ready"
    _consistent(worker)


def test_group_load_skips_blocks_with_pinned_models(start_worker: StartWorker) -> None:
    worker = start_worker(
        [
            fake_model("org/pinned", width=2),
            fake_model("org/a", width=2),
            fake_model("org/b", width=2),
        ],
        devices="cuda:0,cuda:1,cuda:2,cuda:3",
        env={"SIE_PINNED_MODELS": "org/pinned"},
    )
    with worker.client() as client:
        assert client.get("/readyz").status_code in (200, 503)
    from tests.support.worker_fixtures import wait_until

    wait_until(lambda: worker.models()["org/pinned"]["state"] == "ready")
    with worker.client() as client:
        assert client.get("/readyz").status_code == 200
    assert _load(worker, "org/a").json()["devices"] == ["cuda:2", "cuda:3"]
    # org/b must evict org/a, never the pinned group on cuda:0-1.
    assert _load(worker, "org/b").json()["devices"] == ["cuda:2", "cuda:3"]
    models = worker.models()
    assert models["org/pinned"]["state"] == "ready"
    assert models["org/pinned"]["pinned"] is True
    assert models["org/a"]["state"] == "unloaded"
    _consistent(worker)


def test_no_block_can_be_freed_is_a_placement_error_and_retry_works_after_unpin(
    start_worker: StartWorker,
) -> None:
    worker = start_worker(
        [fake_model("org/p1"), fake_model("org/p2"), fake_model("org/other", width=2)],
        devices="cuda:0,cuda:1",
    )
    with worker.client() as client:
        assert client.post("/v1/models/org/p1/pin").status_code == 200
        assert client.post("/v1/models/org/p2/pin").status_code == 200
        refused = client.post("/v1/models/org/other/load")
        assert refused.status_code == 409
        error = refused.json()["error"]
        assert error["code"] == "placement_failed"
        assert "org/p1" in error["message"]
        assert "cuda:0" in error["message"]
        assert "Retry-After" in refused.headers
        assert client.post("/v1/models/org/p1/unpin").status_code == 200
        assert client.post("/v1/models/org/p2/unpin").status_code == 200
        retried = client.post("/v1/models/org/other/load")
        assert retried.status_code == 200
        assert retried.json()["devices"] == ["cuda:0", "cuda:1"]
    _consistent(worker)


def test_single_device_load_on_a_full_worker_evicts_the_least_recently_used_group(
    start_worker: StartWorker,
) -> None:
    worker = start_worker(
        [fake_model("org/g1", width=2), fake_model("org/g2", width=2), fake_model("org/small")],
        devices="cuda:0,cuda:1,cuda:2,cuda:3",
    )
    _load(worker, "org/g1")
    _load(worker, "org/g2")
    with worker.client() as client:  # use g1 so g2 is the least recently used
        response = client.post(
            "/v1/completions", json={"model": "org/g1", "prompt": "hi", "max_tokens": 2}
        )
        assert response.status_code == 200
    entry = _load(worker, "org/small").json()
    assert entry["devices"] == ["cuda:2"]
    models = worker.models()
    assert models["org/g2"]["state"] == "unloaded"
    assert models["org/g1"]["state"] == "ready"
    _consistent(worker)


def test_failed_load_leaves_no_claim(start_worker: StartWorker) -> None:
    worker = start_worker(
        [fake_model("org/broken", width=2, env={"FAKE_ENGINE_EXIT_AT_START": "3"})],
        devices="cuda:0,cuda:1",
    )
    response = _load(worker, "org/broken")
    assert response.status_code == 502
    error = response.json()["error"]
    assert error["code"] == "load_failed"
    assert "code 3" in error["message"]
    model = worker.models()["org/broken"]
    assert model["state"] == "failed"
    assert model["devices"] == []
    assert "code 3" in model["error"]
    assert all(m is None for m in worker.devices().values())
    assert worker.engine_pids() == []


def test_concurrent_requests_for_one_model_share_a_single_load(start_worker: StartWorker) -> None:
    import concurrent.futures

    worker = start_worker(
        [fake_model("org/slow", env={"FAKE_ENGINE_START_DELAY_S": "1"})], devices="cuda:0"
    )

    def complete(_: int) -> int:
        with worker.client() as client:
            return client.post(
                "/v1/completions", json={"model": "org/slow", "prompt": "x", "max_tokens": 1}
            ).status_code

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert list(pool.map(complete, range(8))) == [200] * 8
    with worker.client() as client:
        metrics = client.get("/metrics").text
    assert 'sie_model_loads_total{outcome="ready"} 1.0' in metrics
    assert len(worker.engine_pids()) >= 1


def _engine_masks(worker: WorkerProcess) -> dict[str, str]:
    """Each engine's CUDA_VISIBLE_DEVICES, read from the engine processes themselves."""
    import psutil

    masks: dict[str, str] = {}
    for pid in worker.engine_pids():
        process = psutil.Process(pid)
        argv = process.cmdline()
        if "--served-model-name" not in argv:
            continue
        name = argv[argv.index("--served-model-name") + 1]
        masks[name] = process.environ().get("CUDA_VISIBLE_DEVICES", "<unset>")
    return masks
