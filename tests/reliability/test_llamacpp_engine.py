"""A real llama.cpp engine on a cpu device, started, served, unloaded and killed by the worker.

The engine is ``llama-server`` built from the pinned sdist (scripts/setup-llamacpp); the model
a tiny Llama GGUF the tests write (tests/support/tiny_gguf.py). The worker's devices are
``cpu:0,cpu:1``; llama.cpp runs one device there (``-t`` its cores). The tests share one
worker and run in order (the ``pytest llamacpp`` step of ``make test``). Outputs of random
weights are checked for shape, never for text.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import OpenAI

from tests.reliability._engine_group import complete, engine_group, gone, load, stream
from tests.reliability._support import Launcher, Worker
from tests.support.llamacpp_models import LLAMACPP_BUNDLE, llamacpp_command, llamacpp_model
from tests.support.tiny_gguf import write_tiny_gguf
from tests.support.worker_fixtures import wait_until

pytestmark = [pytest.mark.llamacpp, pytest.mark.slow]

MODEL = "tiny/llamacpp"
BAD = "tiny/llamacpp-bad-flag"


@pytest.fixture(scope="module")
def gguf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf")).parent


@pytest.fixture(scope="module")
def worker(module_launcher: Launcher, gguf_dir: Path) -> Iterator[Worker]:
    configs = [
        llamacpp_model(MODEL, gguf_dir),
        # A value llama-server refuses: only the engine can say so, when it starts.
        {**llamacpp_model(BAD, gguf_dir), "sie_id": BAD},
    ]
    configs[1]["profiles"]["default"]["extra_launch_args"] = ["--cache-reuse", "many"]
    env = {
        "SIE_BUNDLE": LLAMACPP_BUNDLE,
        "SIE_LLAMACPP_COMMAND": llamacpp_command(),
        # Set in the worker's environment: the launcher clears them from the engine's.
        "LLAMA_ARG_N_GPU_LAYERS": "7",
        "LLAMA_API_KEY": "not-for-the-engine",
    }
    started = module_launcher.start(configs, devices="cpu:0,cpu:1", env=env)
    yield started
    started.stop()


def test_a_model_runs_llama_server_on_one_cpu_device_with_its_cores(worker: Worker) -> None:
    loaded = load(worker, MODEL)
    assert loaded.status_code == 200, loaded.text
    assert loaded.json()["devices"] == ["cpu:0"]
    (server,) = engine_group(worker, MODEL)
    argv = server.cmdline()
    assert Path(argv[0]).name == "llama-server"
    assert argv[argv.index("-m") + 1].endswith(".gguf")
    assert argv[argv.index("--alias") + 1] == MODEL
    assert argv[argv.index("-t") + 1] == "1"  # cpu:0 is one core
    assert "--metrics" in argv
    assert server.cpu_affinity() == [0]
    environ = server.environ()
    assert not [k for k in environ if k.startswith("LLAMA_ARG_") or k == "LLAMA_API_KEY"]


def test_completions_chat_and_streams_come_back_through_the_worker(worker: Worker) -> None:
    completion = complete(worker, MODEL, ignore_eos=True)
    assert completion.status_code == 200, completion.text
    body = completion.json()
    assert body["model"] == MODEL
    assert body["usage"]["completion_tokens"] == 6
    chat_body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 4,
        "ignore_eos": True,
    }
    with worker.client(timeout=120) as client:
        chat = client.post("/v1/chat/completions", json=chat_body)
    assert chat.status_code == 200, chat.text
    assert chat.json()["choices"][0]["message"]["role"] == "assistant"
    events = stream(worker, "/v1/chat/completions", {**chat_body, "stream": True})
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks
    # Greedy: a sampled token of random weights may be a piece of a character, which
    # llama-server holds back, so three sampled tokens sometimes streamed no text at all.
    plain_body = {"model": MODEL, "prompt": "Hi", "max_tokens": 3, "stream": True,
                  "ignore_eos": True, "temperature": 0}  # fmt: skip
    plain = stream(worker, "/v1/completions", plain_body)
    assert plain[-1] == "[DONE]"
    assert "".join(json.loads(e)["choices"][0]["text"] for e in plain[:-1])


def test_the_openai_client_works_unchanged(worker: Worker) -> None:
    client = OpenAI(base_url=f"{worker.url}/v1", api_key="unused", timeout=120)
    answer = client.completions.create(
        model=MODEL, prompt="Hello", max_tokens=2, extra_body={"ignore_eos": True}
    )
    assert answer.model == MODEL
    assert answer.usage is not None
    assert answer.usage.completion_tokens == 2


def test_the_model_server_series_come_from_llamacpps_own_metrics(worker: Worker) -> None:
    with worker.client(timeout=30) as client:
        text = client.get("/metrics").text
    assert f'llamacpp:requests_processing{{model="{MODEL}"}}' in text
    assert "sie_worker_requests_running" in text


def test_unloading_leaves_no_process(worker: Worker) -> None:
    group = engine_group(worker, MODEL)
    with worker.client(timeout=60) as client:
        assert client.post(f"/v1/models/{MODEL}/unload").status_code == 200
    assert gone(group, set())  # the unload answers once the engine is gone


def test_sigkill_fails_the_model_with_the_reason_and_the_next_request_loads_it(
    worker: Worker,
) -> None:
    assert load(worker, MODEL).status_code == 200
    group = engine_group(worker, MODEL)
    group[0].send_signal(signal.SIGKILL)
    wait_until(lambda: worker.models()[MODEL]["state"] == "failed", timeout=60)
    model = worker.models()[MODEL]
    assert "engine exited unexpectedly with code -9" in model["error"]
    assert model["devices"] == []
    wait_until(lambda: gone(group, set()), timeout=30)
    again = complete(worker, MODEL, ignore_eos=True)
    assert again.status_code == 200, again.text
    assert worker.models()[MODEL]["state"] == "ready"


def test_a_flag_llama_server_refuses_fails_the_load_with_its_own_message(worker: Worker) -> None:
    refused = load(worker, BAD)
    assert refused.status_code == 502, refused.text
    error = refused.json()["error"]
    assert error["code"] == "load_failed"
    assert "engine exited during startup with code 1" in error["message"]
    assert "--cache-reuse N" in error["message"]  # llama-server's usage of the flag
    assert worker.models()[BAD]["state"] == "failed"
