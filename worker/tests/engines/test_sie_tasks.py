"""The default engine's SIE tasks: cross-encoder scores (``--task score``, ``/v1/rerank``)
and embeddings shaped as SIE shapes its texts (templates, instructions, queries).

Request parsing is tested in-process; the engine runs as a real subprocess with a tiny random
BERT cross-encoder built at test time and all-MiniLM-L6-v2 from its PyPI package.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.default_engine import ENGINE, Engine, start_engine, stop_engine

from sie_worker.engines.transformers._errors import EngineError
from sie_worker.engines.transformers._options import parse_options
from sie_worker.engines.transformers._requests import parse_embedding, parse_rerank

# --- pure pieces ---------------------------------------------------------------------------


def test_embedding_request_reads_is_query_and_instructions_once_or_per_input() -> None:
    one = parse_embedding({"input": ["a", "b"], "is_query": True, "instruction": "Find"})
    assert one.is_query == (True, True)
    assert one.instructions == ("Find", "Find")
    each = parse_embedding(
        {"input": ["a", "b"], "is_query": [True, False], "instruction": [None, "x"]}
    )
    assert each.is_query == (True, False)
    assert each.instructions == (None, "x")
    plain = parse_embedding({"input": ["a"]})
    assert (plain.is_query, plain.instructions, plain.normalize) == (None, None, None)


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"is_query": "yes"}, "is_query"),
        ({"is_query": [True]}, "is_query"),  # two inputs, one value
        ({"instruction": 3}, "instruction"),
        ({"query_template": "q: {txt}"}, "query_template"),
        ({"doc_template": 5}, "doc_template"),
        ({"normalize": "no"}, "normalize"),
    ],
)
def test_embedding_request_refuses_wrong_shaping_fields_naming_them(
    extra: dict[str, Any], field: str
) -> None:
    with pytest.raises(EngineError) as caught:
        parse_embedding({"input": ["a", "b"], **extra})
    assert caught.value.param == field


def test_rerank_request_takes_a_query_and_documents() -> None:
    request = parse_rerank({"query": "q", "documents": ["a", "b"], "return_documents": False})
    assert (request.query, request.documents) == ("q", ("a", "b"))
    for body, field in [
        ({"documents": ["a"]}, "query"),
        ({"query": "q", "documents": []}, "documents"),
        ({"query": "q", "documents": ["a", 1]}, "documents"),
        ({"query": "q", "documents": ["a"], "top_n": 1}, "top_n"),
    ]:
        with pytest.raises(EngineError) as caught:
            parse_rerank(body)
        assert caught.value.param == field


def test_engine_command_line_takes_the_score_task_and_sies_text_options() -> None:
    options = parse_options(["--model-path", "m", "--port", "1", "--task", "score"])
    assert (options.task, options.normalize, options.query_template) == ("score", True, None)
    shaped = parse_options(
        ["--model-path", "m", "--port", "1", "--task", "encode", "--query-template",
         "query: {text}", "--doc-template", "passage: {text}", "--default-instruction", "Find",
         "--no-normalize"]
    )  # fmt: skip
    assert shaped.query_template == "query: {text}"
    assert shaped.doc_template == "passage: {text}"
    assert shaped.default_instruction == "Find"
    assert shaped.normalize is False


def test_engine_command_line_refuses_a_template_with_another_placeholder() -> None:
    done = subprocess.run(
        [*ENGINE, "--model-path", "m", "--port", "1", "--task", "encode",
         "--query-template", "{query}"],
        capture_output=True,
        text=True,
        check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--query-template uses {query}" in done.stderr


# --- the engine, as a subprocess -----------------------------------------------------------


@pytest.fixture(scope="module")
def scorer(
    tiny_cross_encoder_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Engine]:
    log = tmp_path_factory.mktemp("engine") / "scorer.log"
    engine = start_engine(
        ["--model-path", str(tiny_cross_encoder_dir), "--task", "score", "--threads", "1",
         "--max-batch-size", "2"],
        log,
    )  # fmt: skip
    yield engine
    stop_engine(engine)


@pytest.fixture(scope="module")
def shaped_minilm(minilm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    log = tmp_path_factory.mktemp("engine") / "minilm.log"
    engine = start_engine(
        ["--model-path", str(minilm_dir), "--task", "encode", "--threads", "1",
         "--query-template", "query: {text}", "--default-instruction", "Find"],
        log,
    )  # fmt: skip
    yield engine
    stop_engine(engine)


def _logits(model_dir: Path, query: str, documents: list[str]) -> list[float]:
    """The cross-encoder's raw logits, computed by transformers directly (a subprocess keeps
    torch out of pytest)."""
    code = f"""
import json, torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer
tok = AutoTokenizer.from_pretrained({str(model_dir)!r})
model = AutoModelForSequenceClassification.from_pretrained({str(model_dir)!r}).eval()
docs = {documents!r}
with torch.inference_mode():
    batch = tok([{query!r}] * len(docs), docs, padding=True, truncation=True, return_tensors="pt")
    print(json.dumps(model(**batch).logits[:, 0].tolist()))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    logits: list[float] = json.loads(done.stdout.splitlines()[-1])
    return logits


def _embed(engine: Engine, body: dict[str, Any]) -> list[list[float]]:
    response = engine.post("/v1/embeddings", {"model": "m", **body})
    assert response.status_code == 200, response.text
    return [d["embedding"] for d in sorted(response.json()["data"], key=lambda d: d["index"])]


@pytest.mark.slow
def test_rerank_scores_are_the_sigmoid_of_the_cross_encoders_logit_best_first(
    scorer: Engine, tiny_cross_encoder_dir: Path
) -> None:
    documents = ["The quick brown fox.", "One two three four.", "Hello, how are you?"]
    response = scorer.post("/v1/rerank", {"query": "a fox", "documents": documents})
    assert response.status_code == 200, response.text
    results = response.json()
    assert sorted(r["index"] for r in results) == [0, 1, 2]
    assert [r["score"] for r in results] == sorted((r["score"] for r in results), reverse=True)
    expected = [1 / (1 + math.exp(-x)) for x in _logits(tiny_cross_encoder_dir, "a fox", documents)]
    for result in results:
        assert math.isclose(result["score"], expected[result["index"]], abs_tol=1e-5)
        assert result["meta_info"]["prompt_tokens"] > 0


@pytest.mark.slow
def test_score_engine_refuses_embeddings_and_an_embedding_engine_refuses_rerank(
    scorer: Engine, shaped_minilm: Engine
) -> None:
    refused = scorer.post("/v1/embeddings", {"input": "x"})
    assert (refused.status_code, refused.json()["error"]["code"]) == (400, "unsupported_task")
    assert "rerank" in refused.json()["error"]["message"]
    refused = shaped_minilm.post("/v1/rerank", {"query": "q", "documents": ["x"]})
    assert (refused.status_code, refused.json()["error"]["code"]) == (400, "unsupported_task")


@pytest.mark.slow
def test_embeddings_shape_queries_with_the_template_and_leave_documents_plain(
    shaped_minilm: Engine,
) -> None:
    query, document = _embed(
        shaped_minilm, {"input": ["hello", "hello"], "is_query": [True, False]}
    )
    # the reference: the texts shaped by hand, with a request that shapes nothing itself
    plain_query, plain_document = _embed(
        shaped_minilm, {"input": ["query: hello", "hello"], "is_query": False, "query_template": ""}
    )
    assert max(abs(a - b) for a, b in zip(query, plain_query, strict=True)) < 1e-6
    assert max(abs(a - b) for a, b in zip(document, plain_document, strict=True)) < 1e-6
    assert max(abs(a - b) for a, b in zip(query, document, strict=True)) > 1e-3


@pytest.mark.slow
def test_a_documents_instruction_is_prepended_and_normalize_false_keeps_the_pooled_norm(
    shaped_minilm: Engine,
) -> None:
    (with_instruction,) = _embed(shaped_minilm, {"input": ["cats"], "instruction": "Represent"})
    (by_hand,) = _embed(shaped_minilm, {"input": ["Represent cats"]})
    assert max(abs(a - b) for a, b in zip(with_instruction, by_hand, strict=True)) < 1e-6
    (raw,) = _embed(shaped_minilm, {"input": ["cats"], "normalize": False})
    assert abs(math.sqrt(sum(v * v for v in raw)) - 1.0) > 1e-3
