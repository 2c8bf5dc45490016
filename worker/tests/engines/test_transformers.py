"""The default engine (``python -m sie_worker.engines.transformers``).

Pure pieces are tested in-process; the engine itself runs as a real subprocess on a free
127.0.0.1 port and is driven over HTTP, with a tiny random Llama built at test time and
all-MiniLM-L6-v2 from its PyPI package. Nothing reaches a model hub (``HF_HUB_OFFLINE=1``).
"""

from __future__ import annotations

import base64
import json
import math
import os
import shutil
import signal
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support import loopback
from tests.support.default_engine import ENGINE, Engine, start_engine, stop_engine

from sie_worker.engines.transformers._device import StartupError, choose_placement
from sie_worker.engines.transformers._errors import EngineError
from sie_worker.engines.transformers._options import parse_options
from sie_worker.engines.transformers._pooling import PoolingPlan, pooling_plan
from sie_worker.engines.transformers._requests import (
    ChatMessage,
    parse_chat,
    parse_completion,
    parse_embedding,
    render_chat_fallback,
)
from sie_worker.engines.transformers._stops import StopScanner

# --- pure pieces ---------------------------------------------------------------------------


def test_stop_scanner_holds_back_text_that_may_start_a_stop_string() -> None:
    scanner = StopScanner(("END",))
    assert scanner.feed("abc E") == "abc "
    assert scanner.feed("N") == ""
    assert scanner.feed("Dzzz") == ""
    assert scanner.stopped
    assert scanner.flush() == ""


def test_stop_scanner_releases_held_text_when_it_cannot_be_astop_engine() -> None:
    scanner = StopScanner(("END", "\n\n"))
    assert scanner.feed("x E") == "x "
    assert scanner.feed("Nx") == "ENx"
    assert scanner.feed("\n") == ""
    assert scanner.flush() == "\n"
    assert not scanner.stopped


def test_stop_scanner_cuts_at_the_earliest_stop_string() -> None:
    scanner = StopScanner(("b", "a"))
    assert scanner.feed("xxab") == "xx"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"prompt": "hi", "n": 2}, "n"),
        ({"prompt": "hi", "n": True}, "n"),
        ({"prompt": [1, 2, 3]}, "prompt"),
        ({"prompt": ["a", "b"], "stream": True}, "prompt"),
        ({"prompt": "hi", "temperature": 3}, "temperature"),
        ({"prompt": "hi", "top_p": 0}, "top_p"),
        ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "hi", "stop": [""]}, "stop"),
        ({"prompt": "hi", "presence_penalty": 0.5}, "presence_penalty"),
        ({"prompt": "hi", "stream": "yes"}, "stream"),
        ({}, "prompt"),
    ],
)
def test_completion_request_refusals_name_the_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(EngineError) as caught:
        parse_completion(body)
    assert caught.value.status == 400
    assert caught.value.param == field
    assert caught.value.message.startswith(field)


def test_chat_request_takes_text_parts_and_max_completion_tokens() -> None:
    req = parse_chat(
        {
            "messages": [
                {"role": "system", "content": "be brief"},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
            ],
            "max_tokens": 9,
            "max_completion_tokens": 5,
            "stop": "\n",
        }
    )
    assert req.messages == (ChatMessage("system", "be brief"), ChatMessage("user", "ab"))
    assert req.sampling.max_tokens == 5
    assert req.sampling.stop == ("\n",)


@pytest.mark.parametrize(
    "body",
    [
        {"messages": []},
        {"messages": [{"role": "wizard", "content": "x"}]},
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
    ],
)
def test_chat_request_refuses_what_the_engine_cannot_do(body: dict[str, Any]) -> None:
    with pytest.raises(EngineError, match=r"^(messages|tools)"):
        parse_chat(body)


def test_chat_fallback_prompt_ends_with_the_assistant_turn() -> None:
    prompt = render_chat_fallback((ChatMessage("system", "s"), ChatMessage("user", "u")))
    assert prompt.splitlines() == ["system: s", "user: u", "assistant:"]


def test_embedding_request_refuses_token_arrays_and_unknown_formats() -> None:
    assert parse_embedding({"input": ["a", "b"]}).texts == ("a", "b")
    with pytest.raises(EngineError, match=r"^input: token-id arrays"):
        parse_embedding({"input": [[1, 2]]})
    with pytest.raises(EngineError, match=r"^encoding_format"):
        parse_embedding({"input": "a", "encoding_format": "int8"})


def test_pooling_plan_reads_the_sentence_transformers_stack(minilm_dir: Path) -> None:
    plan = pooling_plan(minilm_dir)
    assert plan is not None
    assert (plan.mode, plan.max_seq_length) == ("mean", 256)


def test_pooling_plan_hands_unknown_stacks_to_sentence_transformers(tmp_path: Path) -> None:
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
        {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"},
    ]
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    assert pooling_plan(tmp_path) is None


def test_pooling_plan_accepts_a_sentence_transformers_6_text_stack(tmp_path: Path) -> None:
    prefix = "sentence_transformers.base.modules."
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": prefix + "transformer.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": prefix + "pooling.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": prefix + "normalize.Normalize"},
    ]
    st_config = {
        "transformer_task": "feature-extraction",
        "modality_config": {
            "text": {"method": "forward", "method_output_name": "last_hidden_state"}
        },
        "module_output_name": "token_embeddings",
    }
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    (tmp_path / "sentence_bert_config.json").write_text(json.dumps(st_config))
    (tmp_path / "1_Pooling").mkdir()
    pooling = {"embedding_dimension": 384, "pooling_mode": "cls", "include_prompt": True}
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    assert pooling_plan(tmp_path) == PoolingPlan(mode="cls", max_seq_length=None, lowercase=False)
    st_config["transformer_task"] = "fill-mask"
    (tmp_path / "sentence_bert_config.json").write_text(json.dumps(st_config))
    assert pooling_plan(tmp_path) is None


def test_pooling_plan_defaults_to_mean_pooling_for_a_plain_model_dir(tmp_path: Path) -> None:
    plan = pooling_plan(tmp_path)
    assert plan is not None
    assert plan.mode == "mean"


@pytest.mark.parametrize(
    ("device", "cuda_count", "expected"),
    [
        ("auto", 1, "cuda:0"),
        ("auto", 0, "cpu"),
        ("auto", 2, "cpu"),
        ("cpu", 1, "cpu"),
        ("cuda", 2, "cuda:0"),
    ],
)
def test_device_auto_uses_cuda_only_for_exactly_one_visible_device(
    device: str, cuda_count: int, expected: str
) -> None:
    assert choose_placement(device, "auto", cuda_count).device == expected


def test_dtype_auto_is_float32_on_cpu_and_the_checkpoints_own_on_cuda() -> None:
    assert choose_placement("auto", "auto", 0).dtype == "float32"
    assert choose_placement("auto", "auto", 1).dtype == "auto"
    assert choose_placement("cpu", "bfloat16", 0).dtype == "bfloat16"


def test_device_cuda_without_a_visible_gpu_is_refused_with_the_fix() -> None:
    with pytest.raises(
        StartupError, match=r"--device cuda: torch sees no CUDA device.*--device cpu"
    ):
        choose_placement("cuda", "auto", 0)


def test_options_accept_sglang_dtype_spellings() -> None:
    base = ["--model-path", "m", "--port", "1", "--task", "generate"]
    assert parse_options([*base, "--dtype", "bf16"]).dtype == "bfloat16"
    assert parse_options([*base, "--dtype", "half"]).dtype == "float16"
    assert parse_options(base).served_model_name == "m"


@pytest.mark.parametrize(
    "extra",
    [["--tensor-parallel-size", "2"], ["--tp", "2"], ["--max-batch", "4"], ["--threads", "0"]],
)
def test_engine_command_line_refuses_unknown_flags_and_prefixes(extra: list[str]) -> None:
    result = subprocess.run(
        [*ENGINE, "--model-path", "m", "--port", "1", "--task", "encode", *extra],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert extra[0] in result.stderr


def test_worker_app_cli_and_engine_module_import_without_torch() -> None:
    code = (
        "import sys, sie_worker.cli, sie_worker.worker.app, sie_worker.engines.transformers\n"
        "import sie_worker.engines.transformers._app\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'sentence_transformers', 'sglang')"
        " if m in sys.modules)\n"
        "print(','.join(heavy))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == ""


# --- the engine as a subprocess ------------------------------------------------------------


@pytest.fixture(scope="module")
def llama_engine(
    tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Engine]:
    log = tmp_path_factory.mktemp("engine") / "llama.log"
    engine = start_engine(
        [
            "--model-path",
            str(tiny_llama_dir),
            "--task",
            "generate",
            "--served-model-name",
            "tiny-llama",
        ],
        log,
    )
    yield engine
    stop_engine(engine)


@pytest.fixture(scope="module")
def minilm_engine(minilm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    log = tmp_path_factory.mktemp("engine") / "minilm.log"
    engine = start_engine(
        [
            "--model-path",
            str(minilm_dir),
            "--task",
            "encode",
            "--served-model-name",
            "minilm",
            "--max-batch-size",
            "2",
            "--threads",
            "1",
        ],
        log,
    )
    yield engine
    stop_engine(engine)


def _embed(engine: Engine, texts: list[str]) -> list[list[float]]:
    response = engine.post("/v1/embeddings", {"model": "minilm", "input": texts})
    assert response.status_code == 200, response.text
    return [item["embedding"] for item in response.json()["data"]]


def _cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


@pytest.mark.slow
def test_engine_health_and_models_report_the_model_and_its_device(minilm_engine: Engine) -> None:
    health = loopback.get(minilm_engine.url + "/health").json()
    assert (health["status"], health["device"], health["task"]) == ("ok", "cpu", "encode")
    (model,) = loopback.get(minilm_engine.url + "/v1/models").json()["data"]
    assert (model["id"], model["object"], model["dimensions"]) == ("minilm", "model", 384)


@pytest.mark.slow
def test_minilm_embeddings_are_normalised_384_numbers_that_rank_paraphrases(
    minilm_engine: Engine,
) -> None:
    # five inputs with --max-batch-size 2: three forward passes, answers in input order
    texts = [
        "A man is playing a guitar.",
        "Someone plays an acoustic guitar.",
        "The stock market fell sharply today.",
        "A man is playing a guitar.",
        "",
    ]
    vectors = _embed(minilm_engine, texts)
    assert [len(v) for v in vectors] == [384] * 5
    for vector in vectors:
        assert math.isclose(math.sqrt(sum(x * x for x in vector)), 1.0, rel_tol=1e-4)
    assert _cosine(vectors[0], vectors[1]) > _cosine(vectors[0], vectors[2]) + 0.3
    assert _cosine(vectors[0], vectors[3]) == pytest.approx(1.0, abs=1e-5)


@pytest.mark.slow
def test_embeddings_in_base64_decode_to_the_float_vectors(minilm_engine: Engine) -> None:
    floats = _embed(minilm_engine, ["hello world"])[0]
    response = minilm_engine.post(
        "/v1/embeddings", {"input": "hello world", "encoding_format": "base64"}
    )
    raw = base64.b64decode(response.json()["data"][0]["embedding"])
    decoded = struct.unpack(f"<{len(raw) // 4}f", raw)
    assert decoded == pytest.approx(floats, abs=1e-6)
    assert response.json()["usage"]["prompt_tokens"] == 4  # [CLS] hello world [SEP]


@pytest.mark.slow
def test_native_pooling_matches_sentence_transformers(
    minilm_engine: Engine, minilm_dir: Path
) -> None:
    texts = ["The cat sits on the mat.", "Quantum computers use qubits."]
    script = (
        "import json, sys\n"
        "from sentence_transformers import SentenceTransformer\n"
        f"m = SentenceTransformer({str(minilm_dir)!r}, device='cpu', local_files_only=True)\n"
        f"print(json.dumps(m.encode({texts!r}, normalize_embeddings=True).tolist()))\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, env=env
    )
    reference = json.loads(result.stdout.strip().splitlines()[-1])
    for ours, theirs in zip(_embed(minilm_engine, texts), reference, strict=True):
        assert ours == pytest.approx(theirs, abs=1e-4)


@pytest.mark.slow
def test_embedding_engine_refuses_completions_and_wrong_dimensions(minilm_engine: Engine) -> None:
    response = minilm_engine.post("/v1/completions", {"prompt": "hi"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "unsupported_task")
    assert "tasks.generate" in error["message"]
    response = minilm_engine.post("/v1/embeddings", {"input": "hi", "dimensions": 128})
    assert response.status_code == 400
    assert "384" in response.json()["error"]["message"]


@pytest.mark.slow
def test_completion_generates_max_tokens_with_usage(llama_engine: Engine) -> None:
    body = {"model": "tiny-llama", "prompt": "Hello, how are", "max_tokens": 7, "temperature": 0}
    response = llama_engine.post("/v1/completions", body)
    assert response.status_code == 200, response.text
    data = response.json()
    assert data["object"] == "text_completion"
    assert data["model"] == "tiny-llama"
    (choice,) = data["choices"]
    assert choice["text"].strip()
    assert choice["finish_reason"] == "length"
    assert data["usage"]["completion_tokens"] == 7
    assert data["usage"]["total_tokens"] == data["usage"]["prompt_tokens"] + 7


@pytest.mark.slow
def test_streamed_completion_concatenates_to_the_greedy_text(llama_engine: Engine) -> None:
    body = {"prompt": "The quick brown", "max_tokens": 12, "temperature": 0}
    whole = llama_engine.post("/v1/completions", body).json()["choices"][0]["text"]
    payloads = llama_engine.stream(
        "/v1/completions", {**body, "stream": True, "stream_options": {"include_usage": True}}
    )
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == whole
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == 12


@pytest.mark.slow
def test_stop_string_cuts_the_text_and_finishes_withstop_engine(llama_engine: Engine) -> None:
    body = {"prompt": "One two three", "max_tokens": 24, "temperature": 0}
    whole = llama_engine.post("/v1/completions", body).json()["choices"][0]["text"]
    stop = whole[len(whole) // 2 : len(whole) // 2 + 2]
    expected = whole[: whole.index(stop)]
    for stream in (False, True):
        if stream:
            chunks = [
                json.loads(p)
                for p in llama_engine.stream(
                    "/v1/completions", {**body, "stop": [stop], "stream": True}
                )[:-1]
            ]
            text = "".join(c["choices"][0]["text"] for c in chunks)
            reason = chunks[-1]["choices"][0]["finish_reason"]
        else:
            choice = llama_engine.post("/v1/completions", {**body, "stop": stop}).json()["choices"][
                0
            ]
            text, reason = choice["text"], choice["finish_reason"]
        assert (text, reason) == (expected, "stop")


@pytest.mark.slow
def test_sampling_with_a_seed_repeats(llama_engine: Engine) -> None:
    body = {"prompt": "Hello", "max_tokens": 10, "temperature": 1.0, "top_p": 0.9, "seed": 7}
    first = llama_engine.post("/v1/completions", body).json()["choices"][0]["text"]
    second = llama_engine.post("/v1/completions", body).json()["choices"][0]["text"]
    assert first == second


@pytest.mark.slow
def test_chat_uses_the_tokenizer_chat_template(llama_engine: Engine) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    body = {"messages": messages, "max_tokens": 5, "temperature": 0}
    response = llama_engine.post("/v1/chat/completions", body)
    assert response.status_code == 200, response.text
    chat = response.json()
    assert chat["object"] == "chat.completion"
    assert chat["choices"][0]["message"]["role"] == "assistant"
    # the tiny Llama's template, written out by hand; completions adds the <s> itself
    rendered = "<|system|>Be brief.<|end|><|user|>Hello<|end|><|assistant|>"
    plain = llama_engine.post(
        "/v1/completions", {"prompt": rendered, "max_tokens": 5, "temperature": 0}
    ).json()
    assert chat["usage"] == plain["usage"]
    assert chat["choices"][0]["message"]["content"] == plain["choices"][0]["text"]


@pytest.mark.slow
def test_streamed_chat_sends_role_then_content_then_done(llama_engine: Engine) -> None:
    payloads = llama_engine.stream(
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6, "stream": True},
    )
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[1:]).strip()
    assert chunks[-1]["choices"][0] == {
        "index": 0,
        "delta": {},
        "logprobs": None,
        "finish_reason": "length",
    }


@pytest.mark.slow
def test_prompt_beyond_the_context_length_is_refused(llama_engine: Engine) -> None:
    response = llama_engine.post("/v1/completions", {"prompt": "one two " * 600, "max_tokens": 4})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert "512" in error["message"]


@pytest.mark.slow
def test_generation_engine_refuses_embeddings(llama_engine: Engine) -> None:
    response = llama_engine.post("/v1/embeddings", {"input": "hi"})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "unsupported_task"


@pytest.mark.slow
def test_openai_client_works_against_the_engine_unchanged(
    llama_engine: Engine, minilm_engine: Engine, request: pytest.FixtureRequest
) -> None:
    openai = pytest.importorskip("openai")
    with openai.OpenAI(base_url=minilm_engine.url + "/v1", api_key="unused") as embed:
        vector = embed.embeddings.create(model="minilm", input="hello").data[0].embedding
    assert len(vector) == 384
    chat = openai.OpenAI(base_url=llama_engine.url + "/v1", api_key="unused")
    request.addfinalizer(chat.close)
    messages = [{"role": "user", "content": "Hello"}]
    reply = chat.chat.completions.create(model="tiny-llama", messages=messages, max_tokens=4)
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 4
    stream = chat.chat.completions.create(
        model="tiny-llama", messages=messages, max_tokens=4, stream=True, temperature=0
    )
    pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
    greedy = chat.chat.completions.create(
        model="tiny-llama", messages=messages, max_tokens=4, temperature=0
    )
    assert "".join(pieces) == greedy.choices[0].message.content


_ST_DENSE_BUILDER = """
import json, sys, torch
from sentence_transformers import SentenceTransformer, models
source, target, texts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
torch.manual_seed(0)
stack = [models.Transformer(source), models.Pooling(384, "mean"), models.Dense(384, 16)]
model = SentenceTransformer(modules=stack, device="cpu")
model.save(target)
print(json.dumps(model.encode(texts, normalize_embeddings=True).tolist()))
"""


@pytest.mark.slow
def test_other_sentence_transformers_stacks_are_served_by_sentence_transformers(
    minilm_dir: Path, tmp_path: Path
) -> None:
    texts = ["A dense layer on top.", "Sixteen numbers per sentence."]
    target = tmp_path / "minilm-dense16"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    built = subprocess.run(
        [sys.executable, "-c", _ST_DENSE_BUILDER, str(minilm_dir), str(target), json.dumps(texts)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    reference = json.loads(built.stdout.strip().splitlines()[-1])
    engine = start_engine(["--model-path", str(target), "--task", "encode"], tmp_path / "log")
    try:
        (model,) = loopback.get(engine.url + "/v1/models").json()["data"]
        assert (model["backend"], model["dimensions"]) == ("sentence-transformers", 16)
        for ours, theirs in zip(_embed(engine, texts), reference, strict=True):
            assert ours == pytest.approx(theirs, abs=1e-5)
    finally:
        stop_engine(engine)


@pytest.mark.slow
def test_chat_without_a_template_uses_the_documented_fallback(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    plain = tmp_path / "no-template"
    shutil.copytree(tiny_llama_dir, plain)
    (plain / "chat_template.jinja").unlink()
    engine = start_engine(["--model-path", str(plain), "--task", "generate"], tmp_path / "log")
    try:
        assert loopback.get(engine.url + "/health").json()["chat_template"] is False
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
        chat = engine.post(
            "/v1/chat/completions", {"messages": messages, "max_tokens": 4, "temperature": 0}
        ).json()
        prompt = "system: Be brief.\nuser: Hi\nassistant:"
        completion = engine.post(
            "/v1/completions", {"prompt": prompt, "max_tokens": 4, "temperature": 0}
        ).json()
        assert chat["usage"] == completion["usage"]
        assert chat["choices"][0]["message"]["content"] == completion["choices"][0]["text"]
    finally:
        stop_engine(engine)


@pytest.mark.slow
def test_engine_with_a_missing_model_dir_exits_naming_the_flag(tmp_path: Path) -> None:
    engine = start_engine(
        ["--model-path", str(tmp_path / "nope"), "--task", "generate"], tmp_path / "log", wait=False
    )
    assert engine.process.wait(timeout=120) == 1
    assert "--model-path" in engine.log.read_text()
    assert "no such model directory" in engine.log.read_text()


@pytest.mark.slow
def test_engine_shuts_down_on_sigterm_during_a_stream(tiny_llama_dir: Path, tmp_path: Path) -> None:
    engine = start_engine(
        ["--model-path", str(tiny_llama_dir), "--task", "generate", "--threads", "1"],
        tmp_path / "log",
    )
    with loopback.stream(
        "POST",
        engine.url + "/v1/completions",
        json={"prompt": "Hello", "max_tokens": 500, "stream": True},
        timeout=60.0,
    ) as response:
        next(response.iter_lines())
        engine.process.send_signal(signal.SIGTERM)
        # uvicorn shuts down gracefully, then re-raises the signal it caught
        assert engine.process.wait(timeout=60) == -signal.SIGTERM
    assert "Finished server process" in engine.log.read_text()


def test_the_cuda_memory_fraction_is_a_share_above_0_and_at_most_1() -> None:
    base = ["--model-path", "m", "--port", "30001", "--task", "encode"]
    assert parse_options(base).cuda_memory_fraction is None
    assert parse_options([*base, "--cuda-memory-fraction", "0.25"]).cuda_memory_fraction == 0.25
    for bad in ("0", "1.5", "half"):
        with pytest.raises(SystemExit):
            parse_options([*base, "--cuda-memory-fraction", bad])
