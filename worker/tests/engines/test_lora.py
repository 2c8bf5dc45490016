"""LoRA adapters on the default engine (peft): a tiny LoRA built at test time changes the
tiny Llama's output, the base without it is unchanged, each request gets its own adapter's
output however requests for different adapters interleave, and adapters are named as SGLang
reads them (``model`` ``name:adapter``, else ``lora_path``)."""

from __future__ import annotations

import concurrent.futures
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.default_engine import Engine, start_engine, stop_engine

from sie_worker.engines.transformers._errors import EngineError
from sie_worker.engines.transformers._options import parse_options
from sie_worker.engines.transformers._requests import requested_adapter

# Real engines on the tiny Llama with LoRA adapters: among the suite's longest.
pytestmark = pytest.mark.slow

PROMPT = "The quick brown"


def _engine(tiny_llama_dir: Path, log: Path, *args: str) -> Engine:
    base = ["--model-path", str(tiny_llama_dir), "--task", "generate"]
    return start_engine([*base, "--served-model-name", "tiny", *args], log)


@pytest.fixture(scope="module")
def engines(
    tiny_llama_dir: Path, tiny_lora_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Engine, Engine]]:
    logs = tmp_path_factory.mktemp("lora-engine")
    loras = [a for name, path in tiny_lora_dirs.items() for a in ("--lora", f"{name}={path}")]
    plain = _engine(tiny_llama_dir, logs / "plain.log")
    try:
        with_loras = _engine(tiny_llama_dir, logs / "loras.log", *loras)
    except BaseException:
        stop_engine(plain)
        raise
    yield plain, with_loras
    stop_engine(with_loras)
    stop_engine(plain)


def _text(engine: Engine, **fields: Any) -> str:
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 12, "temperature": 0, **fields}
    response = engine.post("/v1/completions", body)
    assert response.status_code == 200, response.text
    text: str = response.json()["choices"][0]["text"]
    return text


def test_an_adapter_changes_the_output_and_the_base_is_unchanged(
    engines: tuple[Engine, Engine],
) -> None:
    plain, with_loras = engines
    base = _text(plain)
    assert _text(with_loras) == base  # the base, served beside its adapters
    outputs = {name: _text(with_loras, lora_path=name) for name in "abcd"}
    assert all(text != base for text in outputs.values()), outputs
    assert len(set(outputs.values())) == 4, outputs  # each adapter its own
    assert _text(with_loras, model="tiny:a") == outputs["a"]  # SGLang's model:adapter
    assert _text(with_loras, model="tiny:b", lora_path="a") == outputs["b"]  # the model wins


def test_interleaved_requests_for_different_adapters_each_get_their_own(
    engines: tuple[Engine, Engine],
) -> None:
    _, with_loras = engines
    alone = {name: _text(with_loras, lora_path=name) for name in ("a", "b")}
    alone[None] = _text(with_loras)
    asks: list[str | None] = ["a", None, "b", "a", "b", None, "a", "b"]
    with concurrent.futures.ThreadPoolExecutor(len(asks)) as pool:
        futures = [pool.submit(_text, with_loras, **({"lora_path": n} if n else {})) for n in asks]
        got = [f.result() for f in futures]
    assert got == [alone[n] for n in asks]


def test_chat_and_streams_use_the_adapter_too(engines: tuple[Engine, Engine]) -> None:
    plain, with_loras = engines
    messages = [{"role": "user", "content": "Hello, how are you"}]
    chat = {"messages": messages, "max_tokens": 8, "temperature": 0}
    base = plain.post("/v1/chat/completions", {"model": "tiny", **chat}).json()
    tuned = with_loras.post("/v1/chat/completions", {"model": "tiny:c", **chat}).json()
    text = tuned["choices"][0]["message"]["content"]
    assert text != base["choices"][0]["message"]["content"]
    streamed = with_loras.stream(
        "/v1/chat/completions", {"model": "tiny", "lora_path": "c", "stream": True, **chat}
    )
    pieces = [
        json.loads(p)["choices"][0]["delta"].get("content") or "" for p in streamed if p != "[DONE]"
    ]
    assert "".join(pieces) == text


def test_an_adapter_the_engine_was_not_started_with_is_refused(
    engines: tuple[Engine, Engine],
) -> None:
    with_loras = engines[1]
    for engine in engines:
        response = engine.post(
            "/v1/completions", {"model": "tiny", "prompt": "a", "lora_path": "zzz"}
        )
        assert response.status_code == 400, response.text
        assert "not loaded: zzz" in response.json()["error"]["message"]
    info = with_loras.post("/v1/completions", {"model": "tiny:zzz", "prompt": "a"})
    assert info.status_code == 400


def test_the_command_line_takes_adapters_as_name_equals_folder() -> None:
    argv = ["--model-path", "m", "--port", "1", "--task", "generate"]
    options = parse_options([*argv, "--lora", "a=/x/a", "--lora", "b=/x/b"])
    assert options.loras == (("a", "/x/a"), ("b", "/x/b"))
    with pytest.raises(SystemExit):
        parse_options([*argv, "--lora", "a"])
    with pytest.raises(SystemExit):
        parse_options([*argv, "--lora", "a=/x", "--lora", "a=/y"])


def test_a_request_names_its_adapter_as_sglang_reads_it() -> None:
    assert requested_adapter({"model": "tiny"}, "tiny") is None
    assert requested_adapter({"model": "tiny:a"}, "tiny") == "a"
    assert requested_adapter({"model": "tiny", "lora_path": "b"}, "tiny") == "b"
    assert requested_adapter({"model": "tiny:a", "lora_path": "b"}, "tiny") == "a"
    with pytest.raises(EngineError):
        requested_adapter({"model": "tiny", "lora_path": 3}, "tiny")
