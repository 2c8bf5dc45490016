"""A real model end to end from a hub: the worker downloads the tiny Llama from the fake hub
(``HF_ENDPOINT``), starts the default (transformers) engine from the snapshot and answers a
chat completion; a second worker on the same cache serves it offline with the hub gone."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.support import loopback
from tests.support.fake_hub import FakeHub, fetched_files, tiny_model_files
from tests.support.worker_fixtures import WorkerProcess

pytestmark = pytest.mark.slow

MODEL = "tests/tiny-llama-hub"
CONFIG = {
    "sie_id": MODEL,
    "hf_id": MODEL,
    "tasks": {"generate": {"context_length": 256, "max_output_tokens": 32}},
    "profiles": {"default": {"adapter_options": {"loadtime": {"threads": 1}}}},
}
_TIMEOUT = 300.0


def _chat(worker: WorkerProcess) -> httpx.Response:
    with loopback.client(base_url=worker.url, timeout=_TIMEOUT) as client:
        return client.post(
            "/v1/chat/completions",
            json={"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]},
        )


def test_a_model_downloaded_from_the_hub_serves_and_then_starts_offline(
    start_worker: Callable[..., WorkerProcess], tiny_llama_dir: Path, tmp_path: Path
) -> None:
    hf_home = tmp_path / "hf"
    with FakeHub() as hub:
        hub.add_repo(MODEL, tiny_model_files(tiny_llama_dir))
        env = {
            "SIE_BUNDLE": "default",
            "SIE_MODEL_READY_TIMEOUT_S": "240",
            "SIE_WEIGHTS_DOWNLOAD": "worker",
            "HF_HUB_OFFLINE": "",
            "TRANSFORMERS_OFFLINE": "",
            "HF_ENDPOINT": hub.url,
            "HF_HOME": str(hf_home),
        }
        first = start_worker([CONFIG], devices="cpu", env=env)
        answer = _chat(first)
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["role"] == "assistant"
        fetched = fetched_files(hub, MODEL)
        assert "model.safetensors" in fetched
        assert not [f for f in fetched if f.startswith("original/")]
        first.stop()

    offline = {**env, "HF_HUB_OFFLINE": "1"}
    second = start_worker([CONFIG], devices="cpu", env=offline)
    again = _chat(second)
    assert again.status_code == 200, again.text
