"""Weights through the real API: a worker downloads a model from a fake hub, then serves it.

The hub is :class:`tests.support.fake_hub.FakeHub` (``HF_ENDPOINT``); engines are the fake
SGLang engine, which reports the ``--model-path`` it was started with.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.support import loopback
from tests.support.fake_hub import FakeHub, fetched_files, synthetic_model_files
from tests.support.worker_fixtures import WorkerProcess, fake_model, wait_until

StartWorker = Callable[..., WorkerProcess]
REPO = "org/tiny"
SELECTED = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    with FakeHub() as fake:
        yield fake


def hub_env(hub: FakeHub, hf_home: Path, **extra: str) -> dict[str, str]:
    return {
        "SIE_WEIGHTS_DOWNLOAD": "worker",
        "HF_HUB_OFFLINE": "",
        "TRANSFORMERS_OFFLINE": "",  # scripts/lib.sh sets both for the test run
        "HF_ENDPOINT": hub.url,
        "HF_HOME": str(hf_home),
        **extra,
    }


def engine_info(worker: WorkerProcess, model: str) -> dict[str, Any]:
    """What the model's fake engine was started with (found through the worker's children)."""
    import psutil

    for pid in worker.engine_pids():
        cmdline = psutil.Process(pid).cmdline()
        if (
            "--served-model-name" in cmdline
            and cmdline[cmdline.index("--served-model-name") + 1] == model
        ):
            port = cmdline[cmdline.index("--port") + 1]
            info: dict[str, Any] = loopback.get(f"http://127.0.0.1:{port}/_fake/info").json()
            return info
    raise AssertionError(f"no engine serves {model}")


def sample(metrics: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(metrics):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return float(s.value)
    raise AssertionError(f"no sample {name}{labels}")


def load(worker: WorkerProcess, model: str) -> httpx.Response:
    with worker.client() as client:
        return client.post(f"/v1/models/{model}/load")


def snapshot_dir(hf_home: Path, commit: str, repo: str = REPO) -> Path:
    return hf_home / "hub" / ("models--" + repo.replace("/", "--")) / "snapshots" / commit


def test_the_worker_downloads_the_snapshot_and_starts_the_engine_from_it(
    start_worker: StartWorker, hub: FakeHub, tmp_path: Path
) -> None:
    commit = hub.add_repo(REPO, synthetic_model_files())
    worker = start_worker([fake_model(REPO)], devices="cuda:0", env=hub_env(hub, tmp_path / "hf"))

    response = load(worker, REPO)

    assert response.status_code == 200, response.text
    entry = response.json()
    assert (entry["state"], entry["phase"], entry["bytes_done"]) == ("ready", None, None)
    info = engine_info(worker, REPO)
    assert info["model_path"] == str(snapshot_dir(tmp_path / "hf", commit))
    assert "--revision" not in info["argv"]
    assert sorted(fetched_files(hub, REPO)) == SELECTED  # once each, nothing else
    with worker.client() as client:
        answer = client.post("/v1/completions", json={"model": REPO, "prompt": "hi"})
        metrics = client.get("/metrics").text
    assert answer.status_code == 200
    assert 'sie_model_downloads_total{outcome="downloaded"} 1.0' in metrics


def test_models_show_the_download_phase_and_bytes_while_the_weights_arrive(
    start_worker: StartWorker, hub: FakeHub, tmp_path: Path
) -> None:
    hub.add_repo(REPO, synthetic_model_files(weights_bytes=8 << 20))
    hub.bytes_per_s = 2 << 20  # about four seconds
    worker = start_worker([fake_model(REPO)], devices="cuda:0", env=hub_env(hub, tmp_path / "hf"))
    loader = threading.Thread(target=load, args=(worker, REPO))
    loader.start()
    seen: list[dict[str, Any]] = []

    def downloading() -> bool:
        entry = worker.models()[REPO]
        seen.append(entry)
        return entry["phase"] == "downloading" and (entry["bytes_done"] or 0) > 0

    wait_until(downloading, timeout=30)
    entry = seen[-1]
    assert entry["state"] == "loading"
    assert entry["devices"] == []  # no device is claimed while the weights download
    assert entry["bytes_total"] == sum(
        len(synthetic_model_files(weights_bytes=8 << 20)[f]) for f in SELECTED
    )  # type: ignore[arg-type]
    assert entry["bytes_done"] < entry["bytes_total"]
    assert worker.devices() == {"cuda:0": None}
    with worker.client() as client:
        metrics = client.get("/metrics").text
    assert sample(metrics, "sie_models_loading", phase="downloading") == 1
    assert sample(metrics, "sie_model_download_size_bytes", model=REPO) == entry["bytes_total"]
    assert 0 < sample(metrics, "sie_model_download_bytes", model=REPO) <= entry["bytes_total"]
    loader.join(60)
    assert worker.models()[REPO]["state"] == "ready"


def test_a_gated_repo_fails_the_load_naming_401_and_the_next_request_tries_again(
    start_worker: StartWorker, hub: FakeHub, tmp_path: Path
) -> None:
    hub.add_repo(REPO, synthetic_model_files(), gated_token="hf_secret")
    worker = start_worker([fake_model(REPO)], devices="cuda:0", env=hub_env(hub, tmp_path / "hf"))

    response = load(worker, REPO)

    assert response.status_code == 502
    error = response.json()["error"]
    assert error["code"] == "load_failed"
    assert "401 Unauthorized" in error["message"]
    assert "HF_TOKEN" in error["message"]
    assert "Traceback" not in error["message"]
    entry = worker.models()[REPO]
    assert (entry["state"], entry["error"]) == ("failed", error["message"])
    assert worker.devices() == {"cuda:0": None}
    asked = len(hub.requests)
    assert load(worker, REPO).status_code == 502
    assert len(hub.requests) > asked  # retried, not remembered

    env = hub_env(hub, tmp_path / "hf", HF_TOKEN="hf_secret")
    with_token = start_worker([fake_model(REPO)], devices="cuda:0", env=env)
    assert load(with_token, REPO).status_code == 200


@pytest.mark.parametrize(
    ("revision", "fragment"),
    [(None, "404 Not Found from"), ("v9", "no revision 'v9'")],
)
def test_a_missing_repo_or_revision_fails_the_load_naming_404(
    start_worker: StartWorker, hub: FakeHub, tmp_path: Path, revision: str | None, fragment: str
) -> None:
    config = fake_model("org/missing" if revision is None else REPO)
    if revision:
        config["revision"] = revision
    hub.add_repo(REPO, synthetic_model_files())
    worker = start_worker([config], devices="cuda:0", env=hub_env(hub, tmp_path / "hf"))

    response = load(worker, config["sie_id"])

    assert response.status_code == 502
    assert fragment in response.json()["error"]["message"]
    assert "404" in response.json()["error"]["message"]


def test_a_second_worker_on_the_same_cache_starts_offline_without_the_hub(
    start_worker: StartWorker, hub: FakeHub, tmp_path: Path
) -> None:
    commit = hub.add_repo(REPO, synthetic_model_files())
    first = start_worker([fake_model(REPO)], devices="cuda:0", env=hub_env(hub, tmp_path / "hf"))
    assert load(first, REPO).status_code == 200
    first.stop()
    hub.stop()  # the endpoint is gone

    offline = hub_env(hub, tmp_path / "hf", HF_HUB_OFFLINE="1")
    for env in (offline, hub_env(hub, tmp_path / "hf")):
        worker = start_worker([fake_model(REPO)], devices="cuda:0", env=env)
        response = load(worker, REPO)
        assert response.status_code == 200, response.text
        assert engine_info(worker, REPO)["model_path"] == str(snapshot_dir(tmp_path / "hf", commit))
        with worker.client() as client:
            metrics = client.get("/metrics").text
        assert 'sie_model_downloads_total{outcome="cached"} 1.0' in metrics
        worker.stop()


def test_a_half_downloaded_snapshot_is_never_started(
    start_worker: StartWorker, hub: FakeHub, tmp_path: Path
) -> None:
    hub.add_repo(REPO, synthetic_model_files(shards=2))
    hub.drop(REPO, "model-00002-of-00002.safetensors", after_bytes=100, times=20)
    first = start_worker([fake_model(REPO)], devices="cuda:0", env=hub_env(hub, tmp_path / "hf"))
    assert load(first, REPO).status_code == 502
    first.stop()

    offline = hub_env(hub, tmp_path / "hf", HF_HUB_OFFLINE="1")
    worker = start_worker([fake_model(REPO)], devices="cuda:0", env=offline)
    response = load(worker, REPO)

    assert response.status_code == 502
    assert "incomplete" in response.json()["error"]["message"]
    assert worker.engine_pids() == []


def test_concurrent_loads_of_two_profiles_download_the_weights_once(
    start_worker: StartWorker, hub: FakeHub, tmp_path: Path
) -> None:
    hub.add_repo(REPO, synthetic_model_files(weights_bytes=4 << 20))
    hub.bytes_per_s = 4 << 20
    config = fake_model(REPO, profiles={"other": {"extends": "default"}})
    worker = start_worker([config], devices="cuda:0,cuda:1", env=hub_env(hub, tmp_path / "hf"))
    answers: dict[str, int] = {}

    def go(model: str) -> None:
        answers[model] = load(worker, model).status_code

    threads = [threading.Thread(target=go, args=(m,)) for m in (REPO, f"{REPO}:other")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    assert answers == {REPO: 200, f"{REPO}:other": 200}
    assert sorted(fetched_files(hub, REPO)) == SELECTED


def test_an_unload_stops_a_download_and_the_waiting_request_is_told(
    start_worker: StartWorker, hub: FakeHub, tmp_path: Path
) -> None:
    hub.add_repo(REPO, synthetic_model_files(weights_bytes=64 << 20))
    hub.bytes_per_s = 2 << 20  # half a minute
    worker = start_worker([fake_model(REPO)], devices="cuda:0", env=hub_env(hub, tmp_path / "hf"))
    answers: list[httpx.Response] = []
    loader = threading.Thread(target=lambda: answers.append(load(worker, REPO)))
    loader.start()
    wait_until(lambda: (worker.models()[REPO]["bytes_done"] or 0) > 0, timeout=30)

    with worker.client() as client:
        unloaded = client.post(f"/v1/models/{REPO}/unload")
    loader.join(30)

    assert unloaded.status_code == 200
    assert unloaded.json()["state"] == "unloaded"
    assert answers[0].status_code == 502
    assert "load was stopped" in answers[0].json()["error"]["message"]
    assert not list((tmp_path / "hf").rglob("*.incomplete"))
    assert worker.engine_pids() == []


def test_a_load_that_cannot_be_placed_fails_before_downloading(
    start_worker: StartWorker, hub: FakeHub, tmp_path: Path
) -> None:
    hub.add_repo(REPO, synthetic_model_files())
    local = tmp_path / "local-weights"
    local.mkdir()
    pinned = {**fake_model("org/pinned"), "model_path": str(local)}
    env: Mapping[str, str] = hub_env(hub, tmp_path / "hf", SIE_PINNED_MODELS="org/pinned")
    worker = start_worker([pinned, fake_model(REPO)], devices="cuda:0", env=env)
    wait_until(lambda: worker.models()["org/pinned"]["state"] == "ready", timeout=30)

    response = load(worker, REPO)

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "placement_failed"
    assert hub.requests == []  # nothing downloaded for a load that could not run


def test_hub_lora_adapters_are_fetched_with_the_weights_and_started_from_their_snapshots(
    start_worker: StartWorker, hub: FakeHub, tmp_path: Path
) -> None:
    hub.add_repo(REPO, synthetic_model_files())
    adapter = {"adapter_config.json": b'{"r": 4}', "adapter_model.safetensors": b"\0" * 64}
    first = hub.add_repo("org/sql-lora", adapter)
    pinned = hub.add_repo("org/java-lora", adapter, revision="v2")
    loras = {"sql": "org/sql-lora", "java": {"id": "org/java-lora", "revision": pinned}}
    config = fake_model(REPO, lora_paths=loras)
    worker = start_worker([config], devices="cuda:0", env=hub_env(hub, tmp_path / "hf"))

    response = load(worker, REPO)

    assert response.status_code == 200, response.text
    argv = engine_info(worker, REPO)["argv"]
    paths = argv[argv.index("--lora-paths") + 1 :][:2]
    assert paths == [
        f"sql={snapshot_dir(tmp_path / 'hf', first, 'org/sql-lora')}",
        f"java={snapshot_dir(tmp_path / 'hf', pinned, 'org/java-lora')}",
    ]
    assert sorted(fetched_files(hub, "org/sql-lora")) == sorted(adapter)
    with worker.client() as client:
        metrics = client.get("/metrics").text
    assert 'sie_model_downloads_total{outcome="downloaded"} 3.0' in metrics
