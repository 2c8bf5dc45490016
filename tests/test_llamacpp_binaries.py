"""The real llama.cpp binaries (.tools/bin, scripts/setup-llamacpp) serve the tiny GGUF the
tests write, as the llama.cpp engine family relies on: llama-server's readiness, its OpenAI
routes and streams, its ``llamacpp:*`` metrics and its exit on SIGTERM; and, over RPC, layers
on a ggml-rpc-server whose loss aborts llama-server at the next request.

Outputs of random weights are checked for shape, never for text.
"""

from __future__ import annotations

import http.client
import json
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support import loopback
from tests.support.llamacpp_engine import (
    LlamaServer,
    RpcServer,
    start_llama_server,
    start_rpc_server,
    stop,
)
from tests.support.tiny_gguf import write_tiny_gguf

pytestmark = [pytest.mark.llamacpp]

# llama-server's metrics (tools/server/server-context.cpp, @0c1e57098), each a gauge or
# counter named llamacpp:<name>.
METRICS = (
    "llamacpp:prompt_tokens_total",
    "llamacpp:tokens_predicted_total",
    "llamacpp:n_decode_total",
    "llamacpp:requests_processing",
    "llamacpp:requests_deferred",
)
# What llama.cpp's abort() leaves: SIGABRT (a shell reports it as 134).
ABORTED = -signal.SIGABRT


@dataclass
class Started:
    server: LlamaServer
    # /health's answers from the process's start to its first 200 (None: no listener yet)
    health: list[int | None]


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf"))


@pytest.fixture(scope="module")
def started(gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Started]:
    server = start_llama_server(gguf, tmp_path_factory.mktemp("llama-server"), wait=False)
    health: list[int | None] = []
    deadline = time.monotonic() + 60
    while not health or health[-1] != 200:
        assert server.process.poll() is None, server.log.read_text()
        assert time.monotonic() < deadline, server.log.read_text()
        health.append(_health(server.port))
        time.sleep(0.001)
    yield Started(server, health)
    stop(server.process, signal.SIGKILL)


def _health(port: int) -> int | None:
    """/health's status, or None while nothing listens. A bare connection per try: the tiny
    model loads in some 20 ms, and the 503 of that window is what the test looks for."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("GET", "/health")
        response = connection.getresponse()
        response.read()
        return response.status
    except OSError:
        return None
    finally:
        connection.close()


@pytest.fixture(scope="module")
def server(started: Started) -> LlamaServer:
    return started.server


def test_health_is_503_while_the_model_loads_then_200(started: Started) -> None:
    answers = [status for status in started.health if status is not None]
    assert answers[-1] == 200
    assert set(answers[:-1]) == {503}, started.health
    # no refused connection once it answered: the listener is up before the model loads
    assert None not in started.health[started.health.index(503) :]
    body = loopback.get(f"{started.server.url}/health", timeout=5).json()
    assert body == {"status": "ok"}


def test_completions_answer(server: LlamaServer) -> None:
    response = loopback.post(
        f"{server.url}/v1/completions",
        json={"prompt": "The quick brown fox", "max_tokens": 8, "ignore_eos": True},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "text_completion"
    assert isinstance(body["choices"][0]["text"], str)
    assert body["usage"]["completion_tokens"] == 8


def test_chat_completions_answer_through_the_chatml_template(server: LlamaServer) -> None:
    response = loopback.post(
        f"{server.url}/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": "Hello, how are you?"}],
            "max_tokens": 6,
            "ignore_eos": True,
        },
        timeout=60,
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["completion_tokens"] == 6
    # the template's tokens come with the message: <|im_start|>user\n...<|im_end|>\n...
    plain = loopback.post(f"{server.url}/tokenize", json={"content": "Hello, how are you?"})
    assert body["usage"]["prompt_tokens"] >= len(plain.json()["tokens"]) + 3


def test_a_stream_is_server_sent_events_ending_with_done(server: LlamaServer) -> None:
    events: list[str] = []
    with loopback.stream(
        "POST",
        f"{server.url}/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": "Count to ten"}],
            "max_tokens": 5,
            "ignore_eos": True,
            "stream": True,
        },
        timeout=60,
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line[len("data: ") :] for line in response.iter_lines() if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_metrics_are_prometheus_text_with_llamacpp_series(server: LlamaServer) -> None:
    response = loopback.get(f"{server.url}/metrics", timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    names = {
        line.split("{", 1)[0].split(" ", 1)[0]
        for line in response.text.splitlines()
        if line and not line.startswith("#")
    }
    assert set(METRICS) <= names, sorted(names)
    assert all(name.startswith("llamacpp:") for name in names), sorted(names)


def test_sigterm_stops_the_server_with_exit_status_0(server: LlamaServer) -> None:
    # Last in the module: it stops the module's server.
    assert stop(server.process, signal.SIGTERM) == 0


@pytest.fixture(scope="module")
def rpc_pair(
    gguf: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RpcServer, LlamaServer]]:
    workdir = tmp_path_factory.mktemp("rpc")
    rpc = start_rpc_server(workdir)
    # -lv 4: the model loader's log, which names the device of each buffer
    args = ("--rpc", rpc.address, "-ngl", "99", "-lv", "4")
    server = start_llama_server(gguf, workdir, args=args)
    yield rpc, server
    stop(server.process, signal.SIGKILL)
    stop(rpc.process, signal.SIGKILL)


def test_layers_on_an_rpc_server_answer(rpc_pair: tuple[RpcServer, LlamaServer]) -> None:
    rpc, server = rpc_pair
    response = loopback.post(
        f"{server.url}/v1/completions",
        json={"prompt": "Hello", "max_tokens": 4, "ignore_eos": True},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 4
    # every layer went to the RPC device: weights and KV cache
    log = server.log.read_text()
    assert "offloaded 3/3 layers to GPU" in log
    assert f"RPC0[{rpc.address}] model buffer size" in log
    assert f"RPC0[{rpc.address}] KV buffer size" in log


def test_a_lost_rpc_server_aborts_llama_server_at_the_next_request(
    rpc_pair: tuple[RpcServer, LlamaServer],
) -> None:
    rpc, server = rpc_pair
    stop(rpc.process, signal.SIGKILL)
    # Readiness cannot see the lost peer: /health stays 200 while idle.
    assert loopback.get(f"{server.url}/health", timeout=5).status_code == 200
    with pytest.raises(httpx.TransportError):
        loopback.post(
            f"{server.url}/v1/completions",
            json={"prompt": "Hello", "max_tokens": 4},
            timeout=60,
        )
    assert server.process.wait(30) == ABORTED
