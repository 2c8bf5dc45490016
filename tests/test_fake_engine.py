"""The fake SGLang engine, driven as a real subprocess over real sockets."""

from __future__ import annotations

import base64
import json
import math
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support import loopback
from tests.support.engine_fixtures import (
    FAKE_ENGINE_SCRIPT,
    FakeEngine,
    FakeEngineFactory,
    start_fake_engine,
    stop_process_group,
)
from tests.support.fake_engine import fake_embedding, fake_text
from tests.support.ports import free_port

WORKER_ARGV = [
    "--model-path",
    "/models/x",
    "--served-model-name",
    "org/x",
    "--tp-size",
    "2",
    "--dtype",
    "bfloat16",
    "--context-length",
    "32768",
    "--max-total-tokens",
    "32768",
    "--disable-prefill-cuda-graph",
    "--watchdog-timeout",
    "300",
]


def _eventually(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s")
        time.sleep(0.02)


def _events(raw: bytes) -> list[bytes]:
    """Split an SSE body into events; each must be a single ``data:`` line."""
    assert raw.endswith(b"\n\n"), raw[-80:]
    return raw[:-2].split(b"\n\n")


def _payloads(raw: bytes) -> list[Any]:
    events = _events(raw)
    assert all(event.startswith(b"data: ") for event in events), events
    assert events[-1] == b"data: [DONE]"
    return [json.loads(event[len(b"data: ") :]) for event in events[:-1]]


def _run_engine(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(FAKE_ENGINE_SCRIPT), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeEngine]:
    """One generation engine shared by the tests that leave it alive."""
    started = start_fake_engine(tmp_path_factory.mktemp("shared-fake"), ["--context-length", "64"])
    try:
        yield started
    finally:
        stop_process_group(started.proc)


@pytest.fixture
def client(engine: FakeEngine) -> Iterator[httpx.Client]:
    with loopback.client(base_url=engine.url, timeout=10) as http:
        yield http


# --------------------------------------------------------------------------- argv


@pytest.mark.slow
@pytest.mark.torch  # the fake with SGLang's own parser
def test_sglang_parser_accepts_the_worker_argv_and_info_shows_argv_and_mask(
    fake_engine_factory: FakeEngineFactory,
) -> None:
    nccl = free_port()
    argv = [*WORKER_ARGV, "--nccl-port", str(nccl)]
    env = {"CUDA_VISIBLE_DEVICES": "2,3", "FAKE_PROBE": "from-extra-env", "SIE_API_KEY": "s3"}
    engine = fake_engine_factory(*argv, env=env, parser="sglang", timeout_s=120)

    info = engine.info()
    assert info["parser"] == "sglang"
    assert info["argv"] == engine.argv
    assert info["env"]["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert info["env"]["FAKE_PROBE"] == "from-extra-env"
    assert info["env"]["SIE_API_KEY"] == "***"
    assert info["tp_size"] == 2
    assert info["nccl_port"] == nccl
    assert info["args"]["disable_prefill_cuda_graph"] is True
    assert info["args"]["watchdog_timeout"] == 300.0
    assert info["args"]["max_total_tokens"] == 32768
    assert "is_embedding" not in info["args"]
    models = loopback.get(f"{engine.url}/v1/models").json()
    assert models["data"][0]["id"] == "org/x"
    assert models["data"][0]["max_model_len"] == 32768


@pytest.mark.slow
@pytest.mark.torch  # the fake with SGLang's own parser
def test_sglang_parser_rejects_an_unknown_flag_with_exit_2() -> None:
    result = _run_engine("--fake-parser=sglang", *WORKER_ARGV, "--no-such-flag", "1")

    assert result.returncode == 2
    assert "unrecognized arguments: --no-such-flag" in result.stderr


def test_minimal_parser_tolerates_unknown_flags_and_records_them(
    fake_engine_factory: FakeEngineFactory,
) -> None:
    engine = fake_engine_factory(
        *WORKER_ARGV, "--enable-metrics", env={"CUDA_VISIBLE_DEVICES": "0,1"}
    )

    info = engine.info()
    assert info["parser"] == "minimal"
    assert info["tp_size"] == 2
    assert info["served_model_name"] == "org/x"
    assert "--enable-metrics" in info["unknown_args"]
    assert "--disable-prefill-cuda-graph" in info["unknown_args"]


@pytest.mark.parametrize(
    "parser",
    ["minimal", pytest.param("sglang", marks=pytest.mark.torch)],  # SGLang's parser
)
def test_lora_adapters_are_served_and_unknown_ones_refused_as_sglang_does(
    fake_engine_factory: FakeEngineFactory, parser: str
) -> None:
    pinned = '{"lora_name": "p", "lora_path": "org/p", "pinned": true}'
    engine = fake_engine_factory(
        "--model-path", "org/x", "--served-model-name", "org/x", "--enable-lora",
        "--lora-paths", "sql=org/sql-lora", "org/bare", pinned, parser=parser, timeout_s=120,
    )  # fmt: skip
    url = engine.url
    asks = [{"model": "org/x:sql"}, {"model": "org/x", "lora_path": "org/bare"},
            {"model": "org/x", "lora_path": "p"}, {"model": "org/x"}]  # fmt: skip
    for ask in asks:
        served = loopback.post(
            f"{url}/v1/completions", json={**ask, "prompt": "a", "max_tokens": 1}
        )
        assert served.status_code == 200, (ask, served.text)
    refused = loopback.post(
        f"{url}/v1/completions", json={"model": "org/x", "lora_path": "tax", "prompt": "a"}
    )
    assert refused.status_code == 400
    assert "The following requested LoRA adapters are not loaded: tax" in refused.text
    info = engine.info()
    assert info["loras"] == ["sql", "org/bare", "p"]
    assert info["recent_adapters"] == ["sql", "org/bare", "p", None, "tax"]


def test_minimal_parser_requires_model_path_with_exit_2() -> None:
    result = _run_engine("--fake-parser=minimal", "--port", str(free_port()))

    assert result.returncode == 2
    assert "--model-path" in result.stderr


def test_unusable_knob_exits_2_naming_the_variable() -> None:
    result = _run_engine(
        "--fake-parser=minimal", "--model-path", "x", env={"FAKE_ENGINE_START_DELAY_S": "soon"}
    )

    assert result.returncode == 2
    assert "FAKE_ENGINE_START_DELAY_S='soon'" in result.stderr


# --------------------------------------------------------------------------- startup


def test_health_is_503_until_the_start_delay_has_passed(
    fake_engine_factory: FakeEngineFactory,
) -> None:
    engine = fake_engine_factory(env={"FAKE_ENGINE_START_DELAY_S": "2"}, wait="listening")

    assert loopback.get(f"{engine.url}/health").status_code == 503
    assert loopback.get(f"{engine.url}/health_generate").status_code == 503
    early = loopback.post(f"{engine.url}/v1/completions", json={"prompt": "hi"})
    assert early.status_code == 503
    assert engine.info()["ready"] is False
    engine.wait_ready()
    assert loopback.get(f"{engine.url}/health").status_code == 200
    assert engine.info()["ready"] is True


def test_listen_late_engine_refuses_connections_until_ready(
    fake_engine_factory: FakeEngineFactory,
) -> None:
    env = {"FAKE_ENGINE_START_DELAY_S": "2", "FAKE_ENGINE_LISTEN_LATE": "1"}
    engine = fake_engine_factory(env=env, wait="none")
    _eventually(lambda: "server_args=" in engine.stderr())

    with pytest.raises(httpx.ConnectError):
        loopback.get(f"{engine.url}/health")
    engine.wait_ready()
    assert loopback.get(f"{engine.url}/health").status_code == 200


def test_never_ready_engine_listens_with_health_503(
    fake_engine_factory: FakeEngineFactory,
) -> None:
    engine = fake_engine_factory(env={"FAKE_ENGINE_NEVER_READY": "1"}, wait="listening")

    assert loopback.get(f"{engine.url}/health").status_code == 503
    assert engine.info()["ready"] is False
    assert engine.proc.poll() is None


def test_exit_at_start_logs_a_crash_and_exits_with_that_code(
    fake_engine_factory: FakeEngineFactory,
) -> None:
    engine = fake_engine_factory(env={"FAKE_ENGINE_EXIT_AT_START": "3"}, wait="none")

    assert engine.wait_exit() == 3
    stderr = engine.stderr()
    assert "Traceback (most recent call last)" in stderr
    assert "RuntimeError: fake engine: simulated startup failure" in stderr


def test_exit_at_start_after_a_start_delay_serves_503_first(
    fake_engine_factory: FakeEngineFactory,
) -> None:
    env = {"FAKE_ENGINE_EXIT_AT_START": "4", "FAKE_ENGINE_START_DELAY_S": "1"}
    engine = fake_engine_factory(env=env, wait="listening")

    assert loopback.get(f"{engine.url}/health").status_code == 503
    assert engine.wait_exit() == 4


def test_crash_after_s_exits_with_the_crash_code_once_ready(
    fake_engine_factory: FakeEngineFactory,
) -> None:
    env = {"FAKE_ENGINE_CRASH_AFTER_S": "0.3", "FAKE_ENGINE_CRASH_CODE": "7"}
    engine = fake_engine_factory(env=env)

    assert engine.wait_exit() == 7
    assert "The server is fired up" in engine.stderr()
    assert "FAKE_ENGINE_CRASH_AFTER_S" in engine.stderr()


def test_chatty_engine_writes_the_requested_log_lines(
    fake_engine_factory: FakeEngineFactory,
) -> None:
    env = {"FAKE_ENGINE_STDERR_LINES": "300", "FAKE_ENGINE_STDOUT_LINES": "5"}
    engine = fake_engine_factory(env=env)

    assert engine.stderr().count("Load weight progress") == 300
    assert engine.stdout().count("stdout log line") == 5


def test_taken_port_exits_1_with_address_already_in_use(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        engine = start_fake_engine(tmp_path, port=port, wait="none")

        assert engine.wait_exit() == 1
    assert "Address already in use" in engine.stderr()
    assert "(--port)" in engine.stderr()


def test_taken_nccl_port_exits_1_with_address_already_in_use(
    fake_engine_factory: FakeEngineFactory,
) -> None:
    group = ["--model-path", "/m", "--tp-size", "2", "--nccl-port", str(free_port())]
    first = fake_engine_factory(*group)
    second = fake_engine_factory(*group, wait="none")

    assert second.wait_exit() == 1
    assert "Address already in use" in second.stderr()
    assert "(--nccl-port)" in second.stderr()
    assert first.proc.poll() is None


def test_device_mask_narrower_than_tp_size_fails_at_start(
    fake_engine_factory: FakeEngineFactory,
) -> None:
    engine = fake_engine_factory(
        "--model-path", "/m", "--tp-size", "2", env={"CUDA_VISIBLE_DEVICES": "3"}, wait="none"
    )

    assert engine.wait_exit() == 1
    assert "invalid device ordinal" in engine.stderr()


def test_sigterm_exits_0_and_takes_the_rank_processes_along(
    fake_engine_factory: FakeEngineFactory,
) -> None:
    engine = fake_engine_factory(env={"FAKE_ENGINE_CHILDREN": "2"})
    children = engine.info()["children"]
    assert len(children) == 2
    assert all(os.getpgid(child) == engine.pid for child in children)

    engine.proc.send_signal(signal.SIGTERM)

    assert engine.wait_exit() == 0
    for child in children:
        with pytest.raises(ProcessLookupError):
            os.kill(child, 0)


def test_rank_processes_outlive_a_sigkill_of_the_engine_alone(
    fake_engine_factory: FakeEngineFactory,
) -> None:
    engine = fake_engine_factory(env={"FAKE_ENGINE_CHILDREN": "1"})
    (child,) = engine.info()["children"]

    engine.proc.kill()

    assert engine.wait_exit() == -signal.SIGKILL
    assert Path(f"/proc/{child}/stat").read_text().split()[2] != "Z"  # an orphan, not reaped
    engine.stop()
    _eventually(lambda: not Path(f"/proc/{child}").exists() or _is_zombie(child))


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except FileNotFoundError:
        return True


def test_ignored_sigterm_leaves_the_engine_serving_until_sigkill(
    fake_engine_factory: FakeEngineFactory,
) -> None:
    engine = fake_engine_factory(env={"FAKE_ENGINE_IGNORE_SIGTERM": "1"})

    engine.proc.send_signal(signal.SIGTERM)
    _eventually(lambda: "ignoring it" in engine.stderr())

    assert loopback.get(f"{engine.url}/health").status_code == 200
    engine.proc.kill()
    assert engine.wait_exit() == -signal.SIGKILL


# --------------------------------------------------------------------------- HTTP surface


def test_models_and_model_info_describe_the_served_model(client: httpx.Client) -> None:
    models = client.get("/v1/models").json()
    info = client.get("/get_model_info").json()

    assert models["object"] == "list"
    assert [card["id"] for card in models["data"]] == ["fake/model"]
    assert info["model_path"] == "/models/fake"
    assert info["is_generation"] is True
    assert client.get("/health_generate").status_code == 200


def test_completion_echoes_the_prompt_words_with_usage_and_request_id(
    client: httpx.Client,
) -> None:
    response = client.post(
        "/v1/completions",
        json={"model": "fake/model", "prompt": "red green blue", "max_tokens": 5},
        headers={"X-Request-Id": "req-123"},
    )

    assert response.status_code == 200
    assert response.headers["x-request-id"] == "req-123"
    body = response.json()
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"] == "red green blue red green"
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {  # SGLang 0.5.23's usage of a completion, and its ids
        "prompt_tokens": 3,
        "completion_tokens": 5,
        "total_tokens": 8,
        "prompt_tokens_details": None,
        "reasoning_tokens": 0,
        "completion_tokens_details": None,
    }
    assert re.fullmatch(r"[0-9a-f]{32}", body["id"])


def test_chat_completion_answers_the_last_message(client: httpx.Client) -> None:
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "one two"}]},
    ]
    body = client.post(
        "/v1/chat/completions", json={"model": "m", "messages": messages, "max_tokens": 3}
    ).json()

    assert body["object"] == "chat.completion"
    assert body["model"] == "m"
    assert body["choices"][0]["message"] == {
        "role": "assistant",
        "content": "one two one",
        "reasoning_content": None,
        "tool_calls": None,
    }
    assert body["usage"]["completion_tokens"] == 3


def test_completion_stream_is_sse_framed_and_ends_with_done(client: httpx.Client) -> None:
    with client.stream(
        "POST", "/v1/completions", json={"prompt": "a b c", "max_tokens": 7, "stream": True}
    ) as response:
        raw = response.read()

    assert response.headers["content-type"] == "text/event-stream"
    assert response.headers["transfer-encoding"] == "chunked"
    chunks = _payloads(raw)
    assert len(chunks) == 7  # one per token, the finish reason with the last (as SGLang)
    assert "".join(chunk["choices"][0]["text"] for chunk in chunks) == fake_text("a b c", 7)
    assert [chunk["choices"][0]["finish_reason"] for chunk in chunks][-2:] == [None, "length"]
    assert {chunk["usage"] for chunk in chunks} == {None}
    assert {chunk["object"] for chunk in chunks} == {"text_completion"}


def test_chat_stream_sends_role_tokens_finish_and_usage(client: httpx.Client) -> None:
    body = {
        "messages": [{"role": "user", "content": "x y"}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "fake": {"tokens": 3},
    }
    chunks = _payloads(client.post("/v1/chat/completions", json=body).content)

    role = {"reasoning_content": None, "role": "assistant", "content": ""}
    assert chunks[0]["choices"][0]["delta"] == role
    contents = [chunk["choices"][0]["delta"]["content"] for chunk in chunks[1:4]]
    assert "".join(contents) == fake_text("x y", 3)
    assert chunks[4]["choices"][0]["finish_reason"] == "stop"
    assert chunks[4]["choices"][0]["delta"] == {"reasoning_content": None}
    assert chunks[5]["choices"] == []
    assert chunks[5]["usage"] == {
        "prompt_tokens": 2,
        "completion_tokens": 3,
        "total_tokens": 5,
        "reasoning_tokens": 0,
    }


def test_request_beyond_the_context_length_is_refused_like_sglang(client: httpx.Client) -> None:
    response = client.post("/v1/completions", json={"prompt": "a b", "max_tokens": 63})

    assert response.status_code == 400
    assert response.json()["object"] == "error"
    assert "maximum context length of 64 tokens" in response.json()["message"]


def test_embeddings_are_refused_without_is_embedding(client: httpx.Client) -> None:
    response = client.post("/v1/embeddings", json={"input": "hello"})

    assert response.status_code == 400
    assert "--is-embedding" in response.json()["message"]


def test_unknown_path_is_404_and_wrong_method_405(client: httpx.Client) -> None:
    assert client.get("/v1/nothing").status_code == 404
    assert client.get("/v1/completions").status_code == 405


def test_unknown_fake_option_is_refused_naming_it(client: httpx.Client) -> None:
    response = client.post("/v1/completions", json={"prompt": "a", "fake": {"stal_after": 1}})

    assert response.status_code == 400
    assert response.json()["message"].startswith("fake.stal_after: unknown")


def test_info_counts_inference_requests_and_records_request_ids(
    engine: FakeEngine, client: httpx.Client
) -> None:
    before = engine.info()["requests"]
    client.post("/v1/completions", json={"prompt": "a"}, headers={"X-Request-Id": "rid-1"})
    client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "b"}]})

    info = engine.info()
    assert info["requests"] == before + 2
    assert info["recent_request_ids"][-1] == "rid-1"
    assert info["in_flight"] == 0


def test_embedding_engine_returns_deterministic_unit_vectors(
    fake_engine_factory: FakeEngineFactory,
) -> None:
    engine = fake_engine_factory(
        "--model-path", "/m/e", "--is-embedding", env={"FAKE_ENGINE_EMBEDDING_DIM": "8"}
    )
    url = f"{engine.url}/v1/embeddings"

    floats = loopback.post(url, json={"input": ["alpha", "beta"]}).json()
    encoded = loopback.post(url, json={"input": "alpha", "encoding_format": "base64"}).json()
    refused = loopback.post(f"{engine.url}/v1/completions", json={"prompt": "a"})

    vectors = [item["embedding"] for item in floats["data"]]
    assert vectors == [fake_embedding("alpha", 8), fake_embedding("beta", 8)]
    assert math.isclose(sum(v * v for v in vectors[0]), 1.0)
    decoded = struct.unpack("<8f", base64.b64decode(encoded["data"][0]["embedding"]))
    assert all(math.isclose(a, b, rel_tol=1e-6) for a, b in zip(decoded, vectors[0], strict=True))
    assert refused.status_code == 400


# --------------------------------------------------------------------------- per-request faults


def test_tokens_sets_the_stream_length(client: httpx.Client) -> None:
    body = {"prompt": "w", "stream": True, "max_tokens": 2, "fake": {"tokens": 40}}
    chunks = _payloads(client.post("/v1/completions", json=body).content)

    assert len(chunks) == 40


def test_fast_stream_emits_every_token(client: httpx.Client) -> None:
    body = {"prompt": "p q r", "stream": True, "fake": {"fast": True, "tokens": 5000}}
    chunks = _payloads(client.post("/v1/completions", json=body).content)

    assert "".join(chunk["choices"][0]["text"] for chunk in chunks) == fake_text("p q r", 5000)


def test_token_delay_spaces_the_stream_events(fake_engine_factory: FakeEngineFactory) -> None:
    engine = fake_engine_factory(env={"FAKE_ENGINE_TOKEN_DELAY_S": "0.05"})
    body = {"prompt": "a", "stream": True, "fake": {"tokens": 4}}

    started = time.monotonic()
    chunks = _payloads(loopback.post(f"{engine.url}/v1/completions", json=body).content)
    elapsed = time.monotonic() - started

    assert len(chunks) == 4
    assert elapsed >= 0.9 * 0.05 * 4  # a lower bound: four tokens, each after its delay


def test_stream_interval_puts_n_tokens_in_each_event_as_sglang_does(
    fake_engine_factory: FakeEngineFactory,
) -> None:
    engine = fake_engine_factory("--stream-interval", "4")
    body = {"prompt": "p q r", "stream": True, "fake": {"fast": True, "tokens": 10}}
    chunks = _payloads(loopback.post(f"{engine.url}/v1/completions", json=body).content)
    texts = [chunk["choices"][0]["text"] for chunk in chunks]
    # The first token alone, then at 4 and 8 tokens, the remainder with the last.
    assert [len(t.split()) for t in texts] == [1, 3, 4, 2]
    assert "".join(texts) == fake_text("p q r", 10)
    assert chunks[-1]["choices"][0]["finish_reason"] is not None


def test_delay_s_holds_back_the_headers(engine: FakeEngine, client: httpx.Client) -> None:
    slow = {"prompt": "a", "fake": {"delay_s": 2}}
    with pytest.raises(httpx.ReadTimeout):
        client.post("/v1/completions", json=slow, timeout=httpx.Timeout(10, read=0.3))

    assert client.post("/v1/completions", json={"prompt": "a"}).status_code == 200
    _eventually(lambda: engine.info()["in_flight"] == 0)  # noticed the timed-out client left


def test_stall_after_sends_n_events_then_holds_the_connection(
    engine: FakeEngine, client: httpx.Client
) -> None:
    cancelled = engine.info()["cancelled"]
    body = {"prompt": "s", "stream": True, "fake": {"tokens": 10, "stall_after": 3}}
    received = b""
    with client.stream(
        "POST", "/v1/completions", json=body, timeout=httpx.Timeout(10, read=0.5)
    ) as response:
        chunks = response.iter_bytes()
        while received.count(b"\n\n") < 3:
            received += next(chunks)
        with pytest.raises(httpx.ReadTimeout):
            next(chunks)

    assert received.count(b"data: ") == 3
    _eventually(lambda: engine.info()["cancelled"] == cancelled + 1)
    assert engine.info()["in_flight"] == 0


def test_stall_after_without_stream_sends_headers_and_part_of_the_body(
    engine: FakeEngine, client: httpx.Client
) -> None:
    body = {"prompt": "s", "fake": {"stall_after": 10}}
    with client.stream(
        "POST", "/v1/completions", json=body, timeout=httpx.Timeout(10, read=0.5)
    ) as response:
        assert response.status_code == 200
        with pytest.raises(httpx.ReadTimeout):
            response.read()

    _eventually(lambda: engine.info()["in_flight"] == 0)


def test_client_leaving_mid_stream_is_counted_as_cancelled(
    engine: FakeEngine, client: httpx.Client
) -> None:
    cancelled = engine.info()["cancelled"]
    body = {"prompt": "c", "stream": True, "fake": {"tokens": 1000, "token_delay_s": 0.02}}
    with client.stream("POST", "/v1/completions", json=body) as response:
        next(response.iter_bytes())

    _eventually(lambda: engine.info()["cancelled"] == cancelled + 1)
    assert engine.info()["in_flight"] == 0


def _read_stream(url: str, body: dict[str, Any]) -> tuple[bytes, Exception | None]:
    received = b""
    try:
        with loopback.stream("POST", url, json=body) as response:
            for part in response.iter_bytes():
                received += part
    except httpx.HTTPError as exc:
        return received, exc
    return received, None


def test_die_after_exits_the_engine_mid_stream(fake_engine_factory: FakeEngineFactory) -> None:
    engine = fake_engine_factory()
    body = {"prompt": "d", "stream": True, "fake": {"tokens": 10, "die_after": 2}}

    received, error = _read_stream(f"{engine.url}/v1/completions", body)

    assert isinstance(error, httpx.RemoteProtocolError)
    assert received.count(b"data: ") == 2
    assert engine.wait_exit() == 1
    assert "fake.die_after" in engine.stderr()


def test_die_after_zero_exits_before_answering(fake_engine_factory: FakeEngineFactory) -> None:
    engine = fake_engine_factory()

    with pytest.raises(httpx.RemoteProtocolError):
        loopback.post(
            f"{engine.url}/v1/completions", json={"prompt": "d", "fake": {"die_after": 0}}
        )
    assert engine.wait_exit() == 1


def test_malformed_sse_breaks_the_framing_and_omits_done(client: httpx.Client) -> None:
    body = {"prompt": "m", "stream": True, "fake": {"malformed": "sse"}}
    raw = client.post("/v1/completions", json=body).content

    assert b"[DONE]" not in raw
    assert b"\nthis line has no field name\n" in raw
    assert not raw.endswith(b"\n\n")


def test_malformed_json_is_not_json_in_body_or_events(client: httpx.Client) -> None:
    plain = client.post("/v1/completions", json={"prompt": "m", "fake": {"malformed": "json"}})
    body = {"prompt": "m", "stream": True, "fake": {"malformed": "json", "tokens": 2}}
    events = _events(client.post("/v1/completions", json=body).content)

    assert plain.status_code == 200
    with pytest.raises(json.JSONDecodeError):
        plain.json()
    assert events[0] == b"data: {not json"


def test_malformed_huge_chunk_sends_one_multi_megabyte_event(client: httpx.Client) -> None:
    body = {"prompt": "h", "stream": True, "fake": {"malformed": "huge_chunk", "tokens": 2}}
    chunks = _payloads(client.post("/v1/completions", json=body).content)

    assert len(chunks[0]["choices"][0]["text"]) == 4 * 1024 * 1024
    assert chunks[1]["choices"][0]["text"] == " h"


def test_malformed_bad_status_is_500_with_a_plain_text_body(client: httpx.Client) -> None:
    response = client.post(
        "/v1/completions", json={"prompt": "b", "fake": {"malformed": "bad_status"}}
    )

    assert response.status_code == 500
    assert response.headers["content-type"].startswith("text/plain")
    with pytest.raises(json.JSONDecodeError):
        response.json()


def test_commands_run_the_fake_engine_script(
    fake_engine_command: str, fake_engine_minimal_command: str
) -> None:
    assert fake_engine_command.endswith(str(FAKE_ENGINE_SCRIPT))
    assert fake_engine_minimal_command == f"{fake_engine_command} --fake-parser=minimal"


def _sglang_series(url: str) -> dict[str, tuple[dict[str, str], float]]:
    text = loopback.get(f"{url}/metrics").text
    return {
        s.name: (s.labels, s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_are_served_only_with_enable_metrics_as_sglang_does(
    fake_engine_factory: FakeEngineFactory,
) -> None:
    assert loopback.get(f"{fake_engine_factory().url}/metrics").status_code == 404

    engine = fake_engine_factory("--enable-metrics")
    series = _sglang_series(engine.url)

    labels, value = series["sglang:num_queue_reqs"]
    assert labels == {
        "model_name": labels["model_name"],
        "engine_type": "unified",
        "tp_rank": "0",
        "pp_rank": "0",
        "moe_ep_rank": "0",
    }
    assert value == 0.0
    for name in ("sglang:num_running_reqs", "sglang:token_usage", "sglang:gen_throughput"):
        assert series[name][1] == 0.0
    assert series["sglang:num_requests_total"][1] == 0.0


def test_metrics_count_running_and_waiting_requests_and_kv_cache_use(
    fake_engine_factory: FakeEngineFactory,
) -> None:
    engine = fake_engine_factory(
        "--enable-metrics", env={"FAKE_ENGINE_MAX_RUNNING": "1", "FAKE_ENGINE_KV_TOKENS": "100"}
    )
    body = {"model": "x", "prompt": "a b c d", "max_tokens": 6, "fake": {"delay_s": 2}}
    with loopback.client(timeout=30) as client:
        sent = [
            client.build_request("POST", f"{engine.url}/v1/completions", json=body)
            for _ in range(3)
        ]
        threads = [threading.Thread(target=client.send, args=(r,)) for r in sent]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 10
        while engine.info()["in_flight"] < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        series = _sglang_series(engine.url)
        for thread in threads:
            thread.join()
    assert series["sglang:num_running_reqs"][1] == 1.0
    assert series["sglang:num_queue_reqs"][1] == 2.0
    assert series["sglang:token_usage"][1] == 0.3  # 3 x (4 prompt + 6) tokens of 100
    after = _sglang_series(engine.url)
    assert after["sglang:num_requests_total"][1] == 3.0
    assert after["sglang:generation_tokens_total"][1] == 18.0
    assert after["sglang:num_queue_reqs"][1] == 0.0


def test_an_engine_with_a_ready_file_turns_ready_once_the_file_exists(
    fake_engine_factory: FakeEngineFactory, tmp_path: Path
) -> None:
    flag = tmp_path / "ready"
    engine = fake_engine_factory(env={"FAKE_ENGINE_READY_FILE": str(flag)}, wait="listening")
    assert loopback.get(f"{engine.url}/health").status_code == 503
    flag.touch()
    engine.wait_ready(10)
    assert loopback.get(f"{engine.url}/health").status_code == 200
