"""Multi-LoRA end to end on a laptop: a real worker on the default bundle serves the tiny
Llama with two tiny LoRA adapters (built at test time, local folders in ``lora_paths``), and
requests with and without an adapter go over HTTP: OpenAI routes (``model:adapter``,
``lora_path``, sie-sdk's ``lora_adapter``) and SIE's ``/v1/generate``, streaming too.
An adapter changes the answer; the base's answer does not change; ``/v1/models`` lists the
adapters; an unknown one is a 404."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import loopback
from tests.support.default_worker import LLAMA, llama_config, serve_default, shutdown
from tests.support.worker_fixtures import WorkerProcess, write_config

pytestmark = pytest.mark.slow

_TIMEOUT = 300.0
_PROMPT = "The quick brown"


@pytest.fixture(scope="module")
def worker(
    tiny_llama_dir: Path, tiny_lora_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    configs = tmp_path_factory.mktemp("configs")
    config = llama_config(tiny_llama_dir)
    loadtime = config["profiles"]["default"]["adapter_options"]["loadtime"]
    loadtime["lora_paths"] = {"sql": str(tiny_lora_dirs["a"]), "java": str(tiny_lora_dirs["b"])}
    write_config(configs, config)
    process = serve_default(configs, "cpu:0", tmp_path_factory.mktemp("logs") / "worker.log")
    yield process
    shutdown(process)


def _completion(worker: WorkerProcess, **fields: Any) -> str:
    body = {"model": LLAMA, "prompt": _PROMPT, "max_tokens": 10, "temperature": 0, **fields}
    with loopback.client(base_url=worker.url, timeout=_TIMEOUT) as client:
        response = client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    text: str = response.json()["choices"][0]["text"]
    return text


def _streamed(worker: WorkerProcess, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with (
        loopback.client(base_url=worker.url, timeout=_TIMEOUT) as client,
        client.stream("POST", path, json={**body, "stream": True}) as response,
    ):
        assert response.status_code == 200, response.read()
        payloads = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert payloads[-1] == "[DONE]"
    return [json.loads(p) for p in payloads[:-1]]


def test_openai_requests_with_and_without_an_adapter(worker: WorkerProcess) -> None:
    base = _completion(worker)
    sql = _completion(worker, model=f"{LLAMA}:sql")
    java = _completion(worker, lora_path="java")
    assert len({base, sql, java}) == 3
    assert _completion(worker) == base  # the base, unchanged between adapter requests
    assert _completion(worker, lora_adapter="sql") == sql  # sie-sdk's field
    events = _streamed(
        worker, "/v1/completions", {"model": f"{LLAMA}:sql", "prompt": _PROMPT, "max_tokens": 10,
                                    "temperature": 0},
    )  # fmt: skip
    assert "".join(e["choices"][0]["text"] for e in events if e.get("choices")) == sql


def test_the_openai_client_names_adapters_as_sglang_documents(worker: WorkerProcess) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=f"{worker.url}/v1", api_key="none", timeout=_TIMEOUT)
    messages = [{"role": "user", "content": "Hello, how are you"}]
    base = client.chat.completions.create(model=LLAMA, messages=messages, max_tokens=8,
                                          temperature=0)  # fmt: skip
    tuned = client.chat.completions.create(model=f"{LLAMA}:java", messages=messages,
                                           max_tokens=8, temperature=0)  # fmt: skip
    assert tuned.choices[0].message.content != base.choices[0].message.content
    same = client.completions.create(model=LLAMA, prompt=_PROMPT, max_tokens=10, temperature=0,
                                     extra_body={"lora_path": "java"})  # fmt: skip
    assert same.choices[0].text == _completion(worker, lora_path="java")


def test_sie_generate_with_and_without_an_adapter_streaming_too(worker: WorkerProcess) -> None:
    path = f"/v1/generate/{LLAMA.replace('/', '__')}"
    body = {"prompt": _PROMPT, "max_new_tokens": 10, "temperature": 0}
    headers = {"accept": "application/json"}
    with loopback.client(base_url=worker.url, timeout=_TIMEOUT) as client:
        plain = client.post(path, json=body, headers=headers)
        tuned = client.post(path, json={**body, "lora_adapter": "sql"}, headers=headers)
    assert plain.status_code == 200, plain.text
    assert tuned.status_code == 200, tuned.text
    assert plain.json()["text"] == _completion(worker)
    assert tuned.json()["text"] == _completion(worker, lora_path="sql")
    events = _streamed(worker, path, {**body, "lora_adapter": "sql"})
    assert "".join(e.get("text_delta") or "" for e in events) == tuned.json()["text"]


def test_models_lists_the_adapters_and_an_unknown_one_is_a_404(worker: WorkerProcess) -> None:
    with loopback.client(base_url=worker.url, timeout=_TIMEOUT) as client:
        listed = {e["id"]: e for e in client.get("/v1/models").json()["data"]}
        unknown = client.post(
            "/v1/completions", json={"model": f"{LLAMA}:tax", "prompt": "a", "max_tokens": 1}
        )
    assert listed[f"{LLAMA}:sql"]["parent"] == LLAMA
    assert listed[f"{LLAMA}:java"]["parent"] == LLAMA
    assert unknown.status_code == 404
    assert "its adapters: sql, java" in unknown.json()["error"]["message"]
