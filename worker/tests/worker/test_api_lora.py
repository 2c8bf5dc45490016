"""Multi-LoRA on a real worker with a fake SGLang engine behind it: the engine starts with
the adapters, requests name them the ways SGLang's and SIE's clients do (OpenAI and SIE's
native routes, streaming too), ``/v1/models`` lists them with their base, an unknown one is
a 404 naming the model's adapters, and request metrics carry the adapter."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from tests.support import loopback
from tests.support.worker_fixtures import WorkerProcess, fake_model

StartWorker = Callable[..., WorkerProcess]
LORAS = {"sql": "org/sql-lora", "java": "org/java-lora"}
MESSAGES = [{"role": "user", "content": "a b"}]


def engine_info(worker: WorkerProcess, model: str) -> dict[str, Any]:
    """What the model's fake engine was started with and has seen."""
    import psutil

    for pid in worker.engine_pids():
        cmdline = psutil.Process(pid).cmdline()
        if cmdline[cmdline.index("--served-model-name") + 1] == model:
            port = cmdline[cmdline.index("--port") + 1]
            info: dict[str, Any] = loopback.get(f"http://127.0.0.1:{port}/_fake/info").json()
            return info
    raise AssertionError(f"no engine serves {model}")


def sample(metrics: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(metrics):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return 0.0


def _worker(start_worker: StartWorker) -> WorkerProcess:
    config = fake_model("org/gen", lora_paths=LORAS, max_loras_per_batch=2)
    config["profiles"]["fast"] = {"extends": "default"}
    return start_worker([config], devices="cuda:0,cuda:1")  # the profile has its own engine


def test_requests_name_adapters_as_sglang_and_sie_clients_do(start_worker: StartWorker) -> None:
    worker = _worker(start_worker)
    with worker.client() as client:
        sent: list[tuple[str, dict[str, Any]]] = [
            ("/v1/chat/completions", {"model": "org/gen:sql", "messages": MESSAGES}),
            (
                "/v1/chat/completions",
                {"model": "org/gen", "lora_path": "java", "messages": MESSAGES},
            ),
            ("/v1/completions", {"model": "org/gen", "lora_adapter": "sql", "prompt": "a"}),
            ("/v1/completions", {"model": "org/gen:java", "prompt": "a", "stream": True}),
            ("/v1/chat/completions", {"model": "org/gen", "messages": MESSAGES}),  # the base
            ("/v1/chat/completions", {"model": "org/gen:fast", "messages": MESSAGES}),  # a profile
        ]
        for path, body in sent:
            response = client.post(path, json={**body, "max_tokens": 2})
            assert response.status_code == 200, (body, response.text)
            if body.get("stream"):
                assert response.text.rstrip().endswith("data: [DONE]")
        native = client.post(
            "/v1/generate/org__gen",
            json={"prompt": "a b", "max_new_tokens": 2, "lora_adapter": "java"},
            headers={"accept": "application/json"},
        )
        assert native.status_code == 200, native.text
        streamed = client.post(
            "/v1/generate/org__gen",
            json={"prompt": "a b", "max_new_tokens": 2, "lora_adapter": "sql", "stream": True},
        )
        assert streamed.status_code == 200, streamed.text
        metrics = client.get("/metrics").text
    info = engine_info(worker, "org/gen")
    assert info["loras"] == ["sql", "java"]
    assert info["args"]["max_loras_per_batch"] == 2
    # The engine gets each adapter as SGLang's lora_path, under the base's served name.
    # (org/gen:fast runs its own engine)
    assert info["recent_adapters"] == ["sql", "java", "sql", "java", None, "java", "sql"]
    assert sample(metrics, "sie_request_duration_seconds_count", model="org/gen", code="200",
                  adapter="sql") == 3  # fmt: skip
    assert sample(metrics, "sie_request_duration_seconds_count", model="org/gen", code="200",
                  adapter="none") == 1  # fmt: skip


def test_models_lists_each_adapter_with_its_base_as_parent(start_worker: StartWorker) -> None:
    worker = _worker(start_worker)
    with worker.client() as client:
        listed = {e["id"]: e for e in client.get("/v1/models").json()["data"]}
        one = client.get("/v1/models/org/gen:sql")
    assert {"org/gen", "org/gen:fast", "org/gen:sql", "org/gen:java"} <= set(listed)
    sql = listed["org/gen:sql"]
    assert (sql["object"], sql["parent"], sql["root"]) == ("model", "org/gen", "org/sql-lora")
    assert sql["state"] == listed["org/gen"]["state"]
    assert "parent" not in listed["org/gen"]
    assert listed["org/gen:fast:sql"]["parent"] == "org/gen:fast"
    assert one.status_code == 200
    assert one.json()["parent"] == "org/gen"


def test_an_unknown_adapter_is_a_404_naming_the_models_adapters(start_worker: StartWorker) -> None:
    worker = _worker(start_worker)
    with worker.client() as client:
        answers = [
            client.post(
                "/v1/chat/completions", json={"model": "org/gen:tax", "messages": MESSAGES}
            ),
            client.post(
                "/v1/completions", json={"model": "org/gen", "lora_path": "tax", "prompt": "a"}
            ),
            client.post(
                "/v1/generate/org__gen",
                json={"prompt": "a", "max_new_tokens": 1, "lora_adapter": "tax"},
            ),
            client.get("/v1/models/org/gen:tax"),
        ]
    for response, param in zip(
        answers, ("model", "lora_path", "lora_adapter", "model"), strict=True
    ):
        assert response.status_code == 404, response.text
        assert response.headers["x-sie-error-code"] == "MODEL_NOT_FOUND"
        error = response.json()["error"]
        assert error["code"] == "unknown_model"
        assert error["param"] == param
        assert "org/gen has no LoRA adapter 'tax' (its adapters: sql, java)" in error["message"]
