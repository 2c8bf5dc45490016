"""Auth, body limits, probes, metrics and the OpenAPI description of a real worker."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from tests.support import loopback
from tests.support.worker_fixtures import WorkerProcess, fake_model

StartWorker = Callable[..., WorkerProcess]


def test_api_key_is_required_everywhere_but_probes_and_metrics(start_worker: StartWorker) -> None:
    worker = start_worker([fake_model("org/m")], devices="cuda:0", api_key="s3cret")
    with loopback.client(base_url=worker.url) as anonymous:
        for path in ("/healthz", "/readyz", "/metrics"):
            assert anonymous.get(path).status_code == 200, path
        for method, path in (
            ("GET", "/v1/models"),
            ("GET", "/v1/devices"),
            ("GET", "/v1/configs"),
            ("POST", "/v1/models/org/m/load"),
            ("POST", "/v1/completions"),
            ("GET", "/openapi.json"),
        ):
            response = anonymous.request(method, path)
            assert response.status_code == 401, path
            assert response.json()["error"]["code"] == "unauthorized"
            assert response.headers["www-authenticate"] == "Bearer"
        wrong = anonymous.get("/v1/models", headers={"Authorization": "Bearer s3cre"})
        assert wrong.status_code == 401
    with worker.client() as client:
        assert client.get("/v1/models").status_code == 200
    assert "s3cret" not in worker.logs()


def test_oversized_bodies_get_413(start_worker: StartWorker) -> None:
    worker = start_worker(
        [fake_model("org/m")], devices="cuda:0", env={"SIE_MAX_BODY_BYTES": "1024"}
    )
    with worker.client() as client:
        declared = client.post("/v1/completions", content=b"x" * 4096)
        assert declared.status_code == 413
        assert declared.json()["error"]["code"] == "payload_too_large"

        def chunks():  # no Content-Length: counted as it arrives
            for _ in range(8):
                yield b"y" * 512

        streamed = client.post("/v1/completions", content=chunks())
        assert streamed.status_code == 413


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"not json", "JSON object"),
        (b"[1, 2]", "JSON object"),
        (b'{"prompt": "x"}', "'model'"),
    ],
)
def test_malformed_openai_bodies_are_invalid_request(
    start_worker: StartWorker, body: bytes, message: str
) -> None:
    worker = start_worker([], devices="cuda:0")
    with worker.client() as client:
        response = client.post("/v1/completions", content=body)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_request"
    assert message in response.json()["error"]["message"]


def test_embeddings_on_a_generation_model_are_refused_without_loading(
    start_worker: StartWorker,
) -> None:
    worker = start_worker([fake_model("org/m")], devices="cuda:0")
    with worker.client() as client:
        response = client.post("/v1/embeddings", json={"model": "org/m", "input": "x"})
    assert response.status_code == 400
    assert worker.models()["org/m"]["state"] == "unloaded"


def test_unknown_paths_and_methods_use_the_error_shape(start_worker: StartWorker) -> None:
    worker = start_worker([], devices="cuda:0")
    with worker.client() as client:
        missing = client.get("/v2/nothing")
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "not_found"
        wrong = client.delete("/v1/models")
        assert wrong.status_code == 405
        assert wrong.json()["error"]["code"] == "method_not_allowed"


def test_metrics_report_devices_models_loads_and_requests(start_worker: StartWorker) -> None:
    worker = start_worker([fake_model("org/m", width=2)], devices="cuda:0,cuda:1")
    with worker.client() as client:
        client.post("/v1/completions", json={"model": "org/m", "prompt": "x"}).raise_for_status()
        text = client.get("/metrics").text
    assert "sie_devices 2.0" in text
    assert "sie_devices_claimed 2.0" in text
    assert 'sie_models{state="ready"} 1.0' in text
    assert 'sie_model_loads_total{outcome="ready"} 1.0' in text
    assert 'sie_request_duration_seconds_count{adapter="none",code="200",model="org/m"} 1.0' in text
    assert "sie_model_load_duration_seconds_count 1.0" in text


def test_openapi_description_lists_every_endpoint(start_worker: StartWorker) -> None:
    worker = start_worker([], devices="cuda:0")
    spec = worker.get("/openapi.json")
    assert spec["openapi"].startswith("3.1")
    for path in (
        "/healthz",
        "/readyz",
        "/metrics",
        "/v1/models",
        "/v1/devices",
        "/v1/models/{model_id}/load",
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/encode/{model}",
        "/v1/score/{model}",
        "/v1/generate/{model}",
        "/v1/configs",
        "/v1/configs/{sie_id}",
    ):
        assert path in spec["paths"], path


def test_readyz_waits_for_pinned_models(start_worker: StartWorker) -> None:
    worker = start_worker(
        [fake_model("org/p", env={"FAKE_ENGINE_START_DELAY_S": "1.5"})],
        devices="cuda:0",
        env={"SIE_PINNED_MODELS": "org/p"},
    )
    with worker.client() as client:
        first = client.get("/readyz")
        assert client.get("/healthz").status_code == 200
    assert first.status_code == 503
    assert first.json()["waiting_for"] == ["org/p"]
    from tests.support.worker_fixtures import wait_until

    wait_until(lambda: loopback.get(worker.url + "/readyz").status_code == 200)
    assert worker.models()["org/p"]["pinned"] is True
