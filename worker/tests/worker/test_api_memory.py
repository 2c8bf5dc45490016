"""Device memory through the real HTTP API and real engine subprocesses (the fake SGLang
engine): width-1 models share a device while their needs fit its budget, engines get their
share of the memory free when they start, and groups keep their devices to themselves."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
from tests.support.worker_fixtures import WorkerProcess, fake_model

StartWorker = Callable[..., WorkerProcess]
GIB = 2**30
BUDGET_80 = {"SIE_FAKE_MEMORY_BUDGET": "80GiB"}
# f = 0.4 of 80 GiB + 1 GiB = 33 GiB per model: two fit the 76 GiB budget of a device.
NEED_04 = 32 * GIB + GIB


def _small(name: str, fraction: float = 0.4, **kwargs: Any) -> dict[str, Any]:
    return fake_model(name, mem_fraction_static=fraction, **kwargs)


def _load(worker: WorkerProcess, model_id: str) -> httpx.Response:
    with worker.client() as client:
        return client.post(f"/v1/models/{model_id}/load")


def _use(worker: WorkerProcess, model_id: str) -> None:
    with worker.client() as client:
        response = client.post(
            "/v1/completions", json={"model": model_id, "prompt": "hi", "max_tokens": 1}
        )
        assert response.status_code == 200, response.text


def _devices(worker: WorkerProcess) -> dict[str, dict[str, Any]]:
    return {d["device"]: d for d in worker.get("/v1/devices")["devices"]}


def _fraction(worker: WorkerProcess, model_id: str) -> float:
    """The --mem-fraction-static the model's engine was started with."""
    entry = worker.models()[model_id]
    assert entry["state"] == "ready"
    for pid in worker.engine_pids():
        import psutil

        argv = psutil.Process(pid).cmdline()
        if "--served-model-name" in argv and argv[argv.index("--served-model-name") + 1] == (
            model_id
        ):
            return float(argv[argv.index("--mem-fraction-static") + 1])
    raise AssertionError(f"no engine for {model_id}")


def _consistent(worker: WorkerProcess) -> None:
    """``/v1/devices`` and ``/v1/models`` describe the same claims and reservations."""
    devices = _devices(worker)
    models = worker.models()
    for name, device in devices.items():
        holders = sorted(m for m, e in models.items() if name in e["devices"])
        assert sorted(device["models"]) == holders
        assert device["model"] == (device["models"][0] if holders else None)
        if device["memory_total_bytes"] is not None:
            reserved = sum(models[m]["memory_bytes"] for m in holders)
            assert device["memory_reserved_bytes"] == reserved
            if len(holders) > 1:
                assert reserved <= device["memory_budget_bytes"]


def test_three_models_of_0_4_share_two_devices_and_none_is_evicted(
    start_worker: StartWorker,
) -> None:
    worker = start_worker(
        [_small("org/a"), _small("org/b"), _small("org/c")],
        devices="cuda:0,cuda:1",
        env=BUDGET_80,
    )
    assert _load(worker, "org/a").json()["devices"] == ["cuda:0"]
    assert _load(worker, "org/b").json()["devices"] == ["cuda:1"]  # spread: the emptier one
    entry = _load(worker, "org/c").json()
    assert entry["devices"] == ["cuda:0"]
    assert entry["memory_bytes"] == NEED_04
    models = worker.models()
    assert [models[m]["state"] for m in ("org/a", "org/b", "org/c")] == ["ready"] * 3
    devices = _devices(worker)
    assert devices["cuda:0"]["models"] == ["org/a", "org/c"]
    assert devices["cuda:0"]["memory_total_bytes"] == 80 * GIB
    assert devices["cuda:0"]["memory_budget_bytes"] == 76 * GIB
    assert devices["cuda:0"]["memory_reserved_bytes"] == 2 * NEED_04
    assert devices["cuda:1"]["memory_reserved_bytes"] == NEED_04
    _consistent(worker)


def test_an_engine_gets_its_share_of_the_memory_free_when_it_starts(
    start_worker: StartWorker,
) -> None:
    worker = start_worker([_small("org/a"), _small("org/b")], devices="cuda:0", env=BUDGET_80)
    _load(worker, "org/a")
    _load(worker, "org/b")
    # a: 0.4 x 80 GiB of 80 free; b: 32 GiB of the 80 - 33 = 47 GiB free then.
    assert _fraction(worker, "org/a") == 0.4
    assert _fraction(worker, "org/b") == 0.680  # floor(32 / 47, 3 decimals)


def test_undeclared_mem_fraction_static_needs_0_85_and_two_such_models_never_share(
    start_worker: StartWorker,
) -> None:
    worker = start_worker(
        [fake_model("org/big-a"), fake_model("org/big-b")], devices="cuda:0", env=BUDGET_80
    )
    assert _load(worker, "org/big-a").json()["memory_bytes"] == int(0.85 * 80 * GIB) + GIB
    assert _fraction(worker, "org/big-a") == 0.85
    _load(worker, "org/big-b")
    models = worker.models()
    assert models["org/big-a"]["state"] == "unloaded"  # evicted: 69 + 69 GiB exceed 76
    assert models["org/big-b"]["state"] == "ready"
    _consistent(worker)


def test_nothing_fits_evicts_from_the_device_needing_fewest_evictions_lru_first(
    start_worker: StartWorker,
) -> None:
    names = [f"org/m{i}" for i in range(1, 6)]
    worker = start_worker([_small(n) for n in names], devices="cuda:0,cuda:1", env=BUDGET_80)
    for name in names[:4]:
        _load(worker, name)
    placed = {n: worker.models()[n]["devices"] for n in names[:4]}
    assert placed == {
        "org/m1": ["cuda:0"],
        "org/m2": ["cuda:1"],
        "org/m3": ["cuda:0"],
        "org/m4": ["cuda:1"],
    }
    _use(worker, "org/m1")
    _use(worker, "org/m2")
    # Each device needs one eviction: cuda:0 would lose m3, cuda:1 m4; m3 idled longest.
    entry = _load(worker, "org/m5").json()
    assert entry["devices"] == ["cuda:0"]
    models = worker.models()
    assert models["org/m3"]["state"] == "unloaded"
    assert all(models[n]["state"] == "ready" for n in ("org/m1", "org/m2", "org/m4", "org/m5"))
    _consistent(worker)


def test_pinned_models_are_never_evicted_to_make_room(start_worker: StartWorker) -> None:
    worker = start_worker(
        [_small("org/pinned", 0.6), _small("org/idle", 0.2), _small("org/new", 0.3)],
        devices="cuda:0",
        env={**BUDGET_80, "SIE_PINNED_MODELS": "org/pinned"},
    )
    _load(worker, "org/pinned")
    _load(worker, "org/idle")
    # 49 + 17 + 25 GiB exceed the budget: the unpinned model goes, the pinned one stays.
    _load(worker, "org/new")
    models = worker.models()
    assert models["org/pinned"]["state"] == "ready"
    assert models["org/idle"]["state"] == "unloaded"
    assert models["org/new"]["devices"] == ["cuda:0"]
    with worker.client() as client:
        big = client.post("/v1/models/org/pinned/unpin")
        assert big.status_code == 200
    _consistent(worker)


def test_no_room_beside_pinned_models_is_a_placement_error(start_worker: StartWorker) -> None:
    worker = start_worker(
        [_small("org/p", 0.7), _small("org/other", 0.3)],
        devices="cuda:0",
        env={**BUDGET_80, "SIE_PINNED_MODELS": "org/p"},
    )
    assert _load(worker, "org/p").status_code == 200
    refused = _load(worker, "org/other")
    assert refused.status_code == 409
    error = refused.json()["error"]
    assert error["code"] == "placement_failed"
    assert "org/p on cuda:0 (pinned)" in error["message"]
    assert worker.models()["org/other"]["devices"] == []


def test_a_group_load_evicts_the_width_1_models_of_its_block(start_worker: StartWorker) -> None:
    worker = start_worker(
        [_small("org/a"), _small("org/b"), _small("org/c"), fake_model("org/group", width=2)],
        devices="cuda:0,cuda:1,cuda:2,cuda:3",
        env=BUDGET_80,
    )
    for name in ("org/a", "org/b", "org/c"):
        _load(worker, name)  # spread: cuda:0, cuda:1, cuda:2
    _use(worker, "org/a")
    entry = _load(worker, "org/group").json()
    # Blocks 0-1, 1-2, 2-3 need 2, 2 and 1 evictions: cuda:2-3, evicting org/c.
    assert entry["devices"] == ["cuda:2", "cuda:3"]
    models = worker.models()
    assert models["org/c"]["state"] == "unloaded"
    assert models["org/a"]["state"] == models["org/b"]["state"] == "ready"
    devices = _devices(worker)
    assert devices["cuda:2"]["models"] == devices["cuda:3"]["models"] == ["org/group"]
    # A width-1 model never joins a group's devices: cuda:0 and cuda:1 have room.
    _load(worker, "org/c")
    assert worker.models()["org/c"]["devices"] == ["cuda:0"]
    _consistent(worker)


def test_a_width_1_model_displaces_a_group_only_when_groups_hold_every_device(
    start_worker: StartWorker,
) -> None:
    worker = start_worker(
        [fake_model("org/g1", width=2), fake_model("org/g2", width=2), _small("org/small")],
        devices="cuda:0,cuda:1,cuda:2,cuda:3",
        env=BUDGET_80,
    )
    _load(worker, "org/g1")
    _load(worker, "org/g2")
    _use(worker, "org/g1")
    entry = _load(worker, "org/small").json()
    assert entry["devices"] == ["cuda:2"]
    models = worker.models()
    assert models["org/g2"]["state"] == "unloaded"
    assert models["org/g1"]["state"] == "ready"
    _consistent(worker)


def test_pack_puts_the_next_model_on_the_fullest_device_it_fits(
    start_worker: StartWorker,
) -> None:
    worker = start_worker(
        [_small("org/a"), _small("org/b")],
        devices="cuda:0,cuda:1",
        env={**BUDGET_80, "SIE_PLACEMENT_STRATEGY": "pack"},
    )
    _load(worker, "org/a")
    assert _load(worker, "org/b").json()["devices"] == ["cuda:0"]
    assert _devices(worker)["cuda:1"]["models"] == []


def test_an_engine_out_of_memory_at_start_evicts_one_more_model_and_starts_again(
    start_worker: StartWorker,
) -> None:
    worker = start_worker(
        [
            _small("org/old", 0.3),
            _small("org/new", 0.3, env={"FAKE_ENGINE_OOM_ABOVE_FRACTION": "0.4"}),
        ],
        devices="cuda:0",
        env=BUDGET_80,
    )
    _load(worker, "org/old")
    # Beside org/old, 24 GiB of the 55 GiB free is 0.436 of it: the engine runs out of
    # memory; once org/old is gone 24 of 80 is 0.3, and it starts.
    entry = _load(worker, "org/new")
    assert entry.status_code == 200, entry.text
    models = worker.models()
    assert models["org/old"]["state"] == "unloaded"
    assert models["org/new"]["state"] == "ready"
    assert _fraction(worker, "org/new") == 0.3
    assert "out of device memory" in worker.logs()
    _consistent(worker)


def test_an_engine_out_of_memory_with_nothing_left_to_evict_fails_its_load(
    start_worker: StartWorker,
) -> None:
    worker = start_worker(
        [_small("org/greedy", 0.3, env={"FAKE_ENGINE_OOM_ABOVE_FRACTION": "0.2"})],
        devices="cuda:0",
        env=BUDGET_80,
    )
    response = _load(worker, "org/greedy")
    assert response.status_code == 502
    error = response.json()["error"]
    assert error["code"] == "load_failed"
    assert "not enough device memory on cuda:0" in error["message"]
    assert "mem_fraction_static" in error["message"]
    model = worker.models()["org/greedy"]
    assert model["state"] == "failed"
    assert model["devices"] == []
    assert _devices(worker)["cuda:0"]["memory_reserved_bytes"] == 0


def _gauge(worker: WorkerProcess, name: str, device: str) -> float | None:
    from prometheus_client.parser import text_string_to_metric_families

    with worker.client() as client:
        text = client.get("/metrics").text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == {"device": device}:
                return float(sample.value)
    return None


def test_device_memory_metrics_follow_the_reservations(start_worker: StartWorker) -> None:
    worker = start_worker([_small("org/a"), _small("org/b")], devices="cuda:0", env=BUDGET_80)
    _load(worker, "org/a")
    _load(worker, "org/b")
    assert _gauge(worker, "sie_device_memory_total_bytes", "cuda:0") == 80 * GIB
    assert _gauge(worker, "sie_device_memory_budget_bytes", "cuda:0") == int(80 * GIB * 0.95)
    assert _gauge(worker, "sie_device_memory_reserved_bytes", "cuda:0") == 2 * NEED_04
    with worker.client() as client:
        assert client.post("/v1/models/org/a/unload").status_code == 200
    assert _gauge(worker, "sie_device_memory_reserved_bytes", "cuda:0") == NEED_04


def test_a_budget_with_a_space_before_its_unit_is_read(start_worker: StartWorker) -> None:
    worker = start_worker(
        [_small("org/a")], devices="cuda:0", env={"SIE_FAKE_MEMORY_BUDGET": "80 GiB"}
    )
    assert _devices(worker)["cuda:0"]["memory_total_bytes"] == 80 * GIB


@pytest.mark.parametrize("budget", ["lots", "0", "-5GiB"])
def test_an_unreadable_memory_budget_stops_the_worker_naming_the_variable(
    start_worker: StartWorker, budget: str
) -> None:
    worker = start_worker(
        [_small("org/a")], devices="cuda:0", env={"SIE_FAKE_MEMORY_BUDGET": budget}, wait=False
    )
    assert worker.process.wait(timeout=60) != 0
    assert "SIE_FAKE_MEMORY_BUDGET" in worker.logs()


def test_without_known_memory_every_device_takes_one_model(start_worker: StartWorker) -> None:
    worker = start_worker([_small("org/a"), _small("org/b")], devices="cuda:0")
    _load(worker, "org/a")
    _load(worker, "org/b")
    assert worker.models()["org/a"]["state"] == "unloaded"
    device = _devices(worker)["cuda:0"]
    assert _gauge(worker, "sie_device_memory_total_bytes", "cuda:0") is None
    assert device["memory_total_bytes"] is None
    assert device["memory_reserved_bytes"] is None
    assert device["models"] == ["org/b"]
    # The declared fraction goes to the engine as it is.
    assert _fraction(worker, "org/b") == 0.4
