"""The Config API: same checks as reading a file, atomic writes, safe ids, live changes."""

from __future__ import annotations

import concurrent.futures
import json
from collections.abc import Callable
from pathlib import Path

import yaml
from tests.support.worker_fixtures import WorkerProcess, fake_model

StartWorker = Callable[..., WorkerProcess]


def _yaml(doc: object) -> bytes:
    return yaml.safe_dump(doc, sort_keys=False).encode()


def test_put_yaml_creates_a_config_that_serves_without_restart(start_worker: StartWorker) -> None:
    worker = start_worker([], devices="cuda:0")
    config = fake_model("org/new", profiles={"fast": {"extends": "default"}})
    with worker.client() as client:
        created = client.put(
            "/v1/configs/org/new",
            content=_yaml(config),
            headers={"Content-Type": "application/yaml"},
        )
        assert created.status_code == 201
        assert created.json()["models"] == ["org/new", "org/new:fast"]
        assert (worker.config_dir / "org" / "new.yaml").is_file()
        assert client.get("/v1/configs/org/new").json()["sie_id"] == "org/new"
        assert {c["id"] for c in client.get("/v1/configs").json()["data"]} == {"org/new"}
        served = client.post("/v1/completions", json={"model": "org/new:fast", "prompt": "x"})
        assert served.status_code == 200


def test_put_json_replaces_an_existing_config_in_its_own_file(start_worker: StartWorker) -> None:
    worker = start_worker([fake_model("org/m")], devices="cuda:0")
    original = next(worker.config_dir.glob("*.yaml"))
    changed = fake_model("org/m", profiles={"slow": {"extends": "default"}})
    with worker.client() as client:
        replaced = client.put("/v1/configs/org/m", json=changed)
        assert replaced.status_code == 200
        assert replaced.json()["models"] == ["org/m", "org/m:slow"]
    assert yaml.safe_load(original.read_text())["profiles"].keys() == {"default", "slow"}
    assert "org/m:slow" in worker.models()


def test_put_applies_the_same_checks_as_reading_a_file(start_worker: StartWorker) -> None:
    worker = start_worker([], devices="cuda:0")
    bad = fake_model("org/bad")
    bad["profiles"]["default"]["extra_launch_args"] = ["--tp=2"]
    bad["profiles"]["default"]["extra_env"] = {"cuda_visible_devices": "0"}
    with worker.client() as client:
        response = client.put("/v1/configs/org/bad", json=bad)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_config"
    assert "--tensor-parallel-size" in error["message"] or "--tp-size" in error["message"]
    assert "CUDA_VISIBLE_DEVICES" in error["message"].upper()
    assert not list(worker.config_dir.rglob("*.yaml"))
    assert "org/bad" not in worker.models()


def test_put_refuses_a_body_whose_sie_id_differs_from_the_url(start_worker: StartWorker) -> None:
    worker = start_worker([], devices="cuda:0")
    with worker.client() as client:
        response = client.put("/v1/configs/org/one", json=fake_model("org/other"))
    assert response.status_code == 400
    assert "$.sie_id" in response.json()["error"]["message"]


def test_put_refuses_unparseable_bodies_with_invalid_config(start_worker: StartWorker) -> None:
    worker = start_worker([], devices="cuda:0")
    with worker.client() as client:
        for body, kind in ((b"{: nope", "application/yaml"), (b"{nope", "application/json")):
            response = client.put("/v1/configs/org/x", content=body, headers={"Content-Type": kind})
            assert response.status_code == 400
            assert response.json()["error"]["code"] == "invalid_config"


def test_put_json_with_escaped_surrogates_keeps_pairs_and_refuses_lone_ones(
    start_worker: StartWorker,
) -> None:
    worker = start_worker([], devices="cuda:0")
    config = fake_model("org/emoji")
    config["profiles"]["default"]["extra_env"] = {"GREETING": "MARK"}
    body = json.dumps(config)
    with worker.client() as client:
        headers = {"Content-Type": "application/json"}
        lone = client.put(
            "/v1/configs/org/emoji", content=body.replace("MARK", "\\ud83d"), headers=headers
        )
        assert lone.status_code == 400
        assert "$.profiles.default.extra_env.GREETING" in lone.json()["error"]["message"]
        assert not list(worker.config_dir.rglob("*.yaml"))
        paired = client.put(
            "/v1/configs/org/emoji",
            content=body.replace("MARK", "\\ud83d\\ude00"),
            headers=headers,
        )
        assert paired.status_code == 201
        stored = client.get("/v1/configs/org/emoji").json()
    assert stored["profiles"]["default"]["extra_env"] == {"GREETING": "\U0001f600"}


def test_ids_that_would_escape_the_config_dir_are_refused(start_worker: StartWorker) -> None:
    worker = start_worker([], devices="cuda:0")
    with worker.client() as client:
        for bad_id in ("..%2Fescape", "org/../../escape", ".hidden", "org/%00x", "a:b"):
            response = client.put(f"/v1/configs/{bad_id}", json=fake_model("x"))
            assert response.status_code in (400, 404), bad_id
            assert response.json()["error"]["code"] in ("invalid_request", "not_found"), bad_id
    assert not list(worker.config_dir.parent.glob("escape*"))


def test_delete_unloads_the_models_and_removes_the_file(start_worker: StartWorker) -> None:
    worker = start_worker([fake_model("org/m")], devices="cuda:0")
    with worker.client() as client:
        client.post("/v1/models/org/m/load").raise_for_status()
        assert client.delete("/v1/configs/org/m").status_code == 200
        assert client.get("/v1/configs/org/m").status_code == 404
    assert "org/m" not in worker.models()
    assert worker.devices() == {"cuda:0": None}
    assert not list(worker.config_dir.glob("*.yaml"))


def test_a_config_changed_while_loaded_applies_at_the_next_load(start_worker: StartWorker) -> None:
    worker = start_worker([fake_model("org/m")], devices="cuda:0,cuda:1")
    with worker.client() as client:
        client.post("/v1/models/org/m/load").raise_for_status()
        pids = worker.engine_pids()
        changed = fake_model("org/m", width=2, startup_timeout_s=30, request_read_timeout_s=30)
        assert client.put("/v1/configs/org/m", json=changed).status_code == 200
        model = worker.models()["org/m"]
        assert model["state"] == "ready"
        assert model["config_pending"] is True
        assert model["devices"] == ["cuda:0"]
        assert worker.engine_pids() == pids  # still the old engine
        client.post("/v1/models/org/m/unload").raise_for_status()
        reloaded = client.post("/v1/models/org/m/load").json()
    assert reloaded["devices"] == ["cuda:0", "cuda:1"]
    assert reloaded["config_pending"] is False


def test_concurrent_puts_leave_whole_files_only(start_worker: StartWorker) -> None:
    worker = start_worker([], devices="cuda:0")

    def put(i: int) -> int:
        config = fake_model(f"org/m{i % 3}", profiles={f"p{i}": {"extends": "default"}})
        with worker.client() as client:
            return client.put(f"/v1/configs/org/m{i % 3}", json=config).status_code

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        assert set(pool.map(put, range(24))) <= {200, 201}
    files = sorted(worker.config_dir.rglob("*"))
    assert all(not p.name.startswith(".") for p in files)
    for path in (p for p in files if p.is_file()):
        document = yaml.safe_load(path.read_text())
        assert document["sie_id"] == f"org/{path.stem}"


def test_read_only_config_api_refuses_writes(start_worker: StartWorker) -> None:
    worker = start_worker(
        [fake_model("org/m")], devices="cuda:0", env={"SIE_CONFIG_API": "read-only"}
    )
    with worker.client() as client:
        assert client.get("/v1/configs/org/m").status_code == 200
        refused = client.put("/v1/configs/org/m", json=fake_model("org/m"))
        assert refused.status_code == 403
        assert "read-only" in refused.json()["error"]["message"]
        assert client.delete("/v1/configs/org/m").status_code == 403


def test_disabled_config_api_refuses_reads_too(start_worker: StartWorker) -> None:
    worker = start_worker(
        [fake_model("org/m")], devices="cuda:0", env={"SIE_CONFIG_API": "disabled"}
    )
    with worker.client() as client:
        assert client.get("/v1/configs").status_code == 403


def test_stale_temp_files_from_an_interrupted_write_are_removed_at_start(
    start_worker: StartWorker, tmp_path: Path
) -> None:
    directory = tmp_path / "cfg"
    directory.mkdir()
    stale = directory / ".m.yaml.abc.sie-tmp"
    stale.write_text("sie_id: half")
    worker = start_worker([fake_model("org/m")], devices="cuda:0", config_dir=directory)
    assert not stale.exists()
    assert set(worker.models()) == {"org/m"}
