"""SIE's own client, the real ``sie-sdk==0.10.1`` (in .venv-sdk), against a worker on the
default bundle serving all-MiniLM-L6-v2 (the quickstart model), a tiny Llama and a tiny
BERT cross-encoder: what a user's SIE code does, unchanged, with nothing else in between."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import loopback
from tests.support.default_worker import (
    CROSS_ENCODER,
    LLAMA,
    MINILM,
    cross_encoder_config,
    llama_config,
    minilm_config,
    serve_default,
    shutdown,
)
from tests.support.sie_sdk import SdkRunner
from tests.support.worker_fixtures import WorkerProcess, write_config

pytestmark = pytest.mark.slow

BROKEN = "tests/broken"
_TEMPLATES = {"query_template": "query: {text}", "doc_template": "passage: {text}"}


@pytest.fixture(scope="module")
def worker(
    minilm_dir: Path,
    tiny_llama_dir: Path,
    tiny_cross_encoder_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[WorkerProcess]:
    """Four CPU slots: MiniLM (and its profile with SIE-style templates), the Llama and the
    cross-encoder stay loaded together."""
    configs = tmp_path_factory.mktemp("configs")
    e5 = {"e5": {"adapter_options": {"runtime": _TEMPLATES}}}
    write_config(configs, minilm_config(minilm_dir, **e5))
    write_config(configs, llama_config(tiny_llama_dir))
    write_config(configs, cross_encoder_config(tiny_cross_encoder_dir))
    # A directory that holds no model: its engine exits while loading.
    empty = tmp_path_factory.mktemp("no-model")
    write_config(configs, {**cross_encoder_config(empty), "sie_id": BROKEN, "hf_id": BROKEN})
    log = tmp_path_factory.mktemp("logs") / "worker.log"
    process = serve_default(configs, "cpu:0,cpu:1,cpu:2,cpu:3", log)
    yield process
    shutdown(process)


def _embeddings(worker: WorkerProcess, model: str, texts: list[str]) -> list[list[float]]:
    body = {"model": model, "input": texts}
    response = loopback.post(worker.url + "/v1/embeddings", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return [d["embedding"] for d in sorted(response.json()["data"], key=lambda d: d["index"])]


def _close(a: list[float], b: list[float], tolerance: float = 1e-6) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= tolerance for x, y in zip(a, b, strict=True))


def test_list_models_shows_each_config_in_sies_words(
    sie_sdk: SdkRunner, worker: WorkerProcess
) -> None:
    models = sie_sdk.run("result = SIEClient(url).list_models()", url=worker.url)
    by_name = {m["name"]: m for m in models}
    assert set(by_name) == {MINILM, LLAMA, CROSS_ENCODER, BROKEN}
    minilm = by_name[MINILM]
    assert minilm["outputs"] == ["dense"]
    assert minilm["dims"] == {"dense": 384}
    assert minilm["inputs"] == ["text"]
    assert set(minilm["profiles"]) == {"default", "e5"}
    assert minilm["profiles"]["default"]["is_default"] is True
    assert by_name[CROSS_ENCODER]["outputs"] == ["score"]
    assert by_name[LLAMA]["outputs"] == ["tokens"]
    assert by_name[LLAMA]["capabilities"]["streaming"] is True
    for model in models:
        assert model["state"] in {"available", "loading", "loaded", "failed"}
        assert model["loaded"] is (model["state"] == "loaded")


def test_encode_of_one_item_and_of_a_batch_equals_the_openai_embeddings(
    sie_sdk: SdkRunner, worker: WorkerProcess
) -> None:
    texts = ["How do I reset my password?", "The train leaves at noon.", "Cats purr."]
    result = sie_sdk.run(
        """
client = SIEClient(url)
one = client.encode(model, {"text": texts[0]})
batch = client.encode(model, [{"id": f"i{n}", "text": t} for n, t in enumerate(texts)])
result = {
    "one": {"dense": one["dense"], "dtype": str(one["dense"].dtype)},
    "batch": [{"id": r["id"], "dense": r["dense"]} for r in batch],
}
""",
        url=worker.url,
        model=MINILM,
        texts=texts,
    )
    expected = _embeddings(worker, MINILM, texts)
    assert result["one"]["dtype"] == "float32"
    assert _close(result["one"]["dense"], expected[0])
    assert [r["id"] for r in result["batch"]] == ["i0", "i1", "i2"]
    for item, vector in zip(result["batch"], expected, strict=True):
        assert _close(item["dense"], vector)


def test_encode_reads_queries_and_documents_through_the_profiles_templates(
    sie_sdk: SdkRunner, worker: WorkerProcess
) -> None:
    result = sie_sdk.run(
        """
client = SIEClient(url)
result = {
    "query": client.encode(model, {"text": "hello world"}, is_query=True)["dense"],
    "document": client.encode(model, {"text": "hello world"})["dense"],
}
""",
        url=worker.url,
        model=MINILM + ":e5",
    )
    query, document = _embeddings(worker, MINILM, ["query: hello world", "passage: hello world"])
    assert _close(result["query"], query)
    assert _close(result["document"], document)


def test_encode_converts_to_the_output_dtype_sie_defines(
    sie_sdk: SdkRunner, worker: WorkerProcess
) -> None:
    result = sie_sdk.run(
        """
client = SIEClient(url)
result = {}
for dtype in ("float16", "int8", "binary"):
    dense = client.encode(model, {"text": "hello"}, output_dtype=dtype)["dense"]
    result[dtype] = {"dtype": str(dense.dtype), "values": dense}
""",
        url=worker.url,
        model=MINILM,
    )
    (vector,) = _embeddings(worker, MINILM, ["hello"])
    assert result["float16"]["dtype"] == "float16"
    assert _close(result["float16"]["values"], vector, tolerance=1e-3)
    scale = max(abs(v) for v in vector)
    assert result["int8"]["dtype"] == "int8"
    assert result["int8"]["values"] == [round(v / scale * 127) for v in vector]
    bits = [1 if v > 0 else 0 for v in vector]
    packed = [int("".join(map(str, bits[i : i + 8])), 2) for i in range(0, len(bits), 8)]
    assert (result["binary"]["dtype"], result["binary"]["values"]) == ("uint8", packed)


def test_score_ranks_items_with_the_cross_encoder(
    sie_sdk: SdkRunner, worker: WorkerProcess
) -> None:
    result = sie_sdk.run(
        """
client = SIEClient(url)
query = {"id": "q", "text": "what is a fox?"}
items = [{"id": "a", "text": "The quick brown fox."}, {"text": "One two three."},
         {"id": "c", "text": "Hello, how are you?"}]
ranked = client.score(model, query, items)
alone = [client.score(model, query, [item])["scores"][0]["score"] for item in items]
result = {"ranked": ranked, "alone": alone}
""",
        url=worker.url,
        model=CROSS_ENCODER,
    )
    ranked = result["ranked"]
    assert ranked["query_id"] == "q"
    scores = ranked["scores"]
    assert [s["rank"] for s in scores] == [0, 1, 2]
    assert [s["score"] for s in scores] == sorted((s["score"] for s in scores), reverse=True)
    assert {s["item_id"] for s in scores} == {"a", "item-1", "c"}
    by_id = {s["item_id"]: s["score"] for s in scores}
    # a sigmoid of the logit, the same whether scored in a batch or alone
    for item_id, alone in zip(("a", "item-1", "c"), result["alone"], strict=True):
        assert 0.0 < by_id[item_id] < 1.0
        assert math.isclose(by_id[item_id], alone, abs_tol=1e-5)


def test_score_of_a_bi_encoder_is_the_cosine_of_query_and_item_embeddings(
    sie_sdk: SdkRunner, worker: WorkerProcess
) -> None:
    result = sie_sdk.run(
        """
client = SIEClient(url)
items = [{"id": "near", "text": "How can I change my password?"},
         {"id": "far", "text": "The train to Berlin leaves at noon."}]
result = client.score(model, {"text": "I forgot my password"}, items)["scores"]
""",
        url=worker.url,
        model=MINILM,
    )
    query, near, far = _embeddings(
        worker,
        MINILM,
        [
            "I forgot my password",
            "How can I change my password?",
            "The train to Berlin leaves at noon.",
        ],
    )
    cosine = {
        "near": sum(a * b for a, b in zip(query, near, strict=True)),
        "far": sum(a * b for a, b in zip(query, far, strict=True)),
    }
    assert [s["item_id"] for s in result] == ["near", "far"]
    for entry in result:
        assert math.isclose(entry["score"], cosine[entry["item_id"]], abs_tol=1e-5)


def test_generate_and_stream_generate_match_the_openai_completion(
    sie_sdk: SdkRunner, worker: WorkerProcess
) -> None:
    result = sie_sdk.run(
        """
client = SIEClient(url)
kwargs = {"max_new_tokens": 6, "temperature": 0.0}
result = {"generated": client.generate(model, "The quick brown", **kwargs),
          "chunks": list(client.stream_generate(model, "The quick brown", **kwargs))}
""",
        url=worker.url,
        model=LLAMA,
    )
    body = {"model": LLAMA, "prompt": "The quick brown", "max_tokens": 6, "temperature": 0}
    completion = loopback.post(worker.url + "/v1/completions", json=body, timeout=300).json()
    text = completion["choices"][0]["text"]
    generated = result["generated"]
    assert generated["model"] == LLAMA
    assert generated["text"] == text
    assert generated["finish_reason"] == completion["choices"][0]["finish_reason"]
    assert generated["usage"] == completion["usage"]
    chunks = result["chunks"]
    *deltas, last = chunks
    assert [c["seq"] for c in chunks] == list(range(len(chunks)))
    assert all(c["done"] is False for c in deltas)
    assert "".join(c["text_delta"] for c in deltas) == text
    assert last["done"] is True
    assert last["finish_reason"] == generated["finish_reason"]
    assert last["usage"] == completion["usage"]
    assert last["ttft_ms"] >= 0
    assert len({c["request_id"] for c in chunks}) == 1


def test_chat_completions_and_the_async_client_work(
    sie_sdk: SdkRunner, worker: WorkerProcess
) -> None:
    result = sie_sdk.run(
        """
import asyncio
client = SIEClient(url)
chat = client.chat_completions(llama, [{"role": "user", "content": "hi"}], max_tokens=4)

async def main():
    async with SIEAsyncClient(url) as aclient:
        encoded = await aclient.encode(minilm, [{"text": "x"}])
        chunks = [c async for c in aclient.stream_generate(llama, "hi", max_new_tokens=3)]
        return encoded[0]["dense"], chunks[-1]

dense, last = asyncio.run(main())
result = {"chat": chat, "dense": dense, "last": last}
""",
        url=worker.url,
        llama=LLAMA,
        minilm=MINILM,
    )
    assert result["chat"]["object"] == "chat.completion"
    assert isinstance(result["chat"]["choices"][0]["message"]["content"], str)
    assert _close(result["dense"], _embeddings(worker, MINILM, ["x"])[0])
    assert result["last"]["done"] is True


def test_an_unknown_model_raises_the_sdks_model_not_found(
    sie_sdk: SdkRunner, worker: WorkerProcess
) -> None:
    errors = sie_sdk.run(
        """
client = SIEClient(url)
result = [
    error_of(client.encode, "no-such/model", {"text": "x"}),
    error_of(client.score, "no-such/model", {"text": "q"}, [{"text": "x"}]),
    error_of(client.generate, "no-such/model", "hi", max_new_tokens=2),
    error_of(client.get_model, "no-such/model"),
]
""",
        url=worker.url,
    )
    for error in errors:
        assert error["type"] == "RequestError", error
        assert (error["code"], error["status_code"]) == ("MODEL_NOT_FOUND", 404)


def test_a_model_that_fails_to_load_raises_model_load_failed_error(
    sie_sdk: SdkRunner, worker: WorkerProcess
) -> None:
    error: Any = sie_sdk.run(
        "result = error_of(SIEClient(url).score, model, {'text': 'q'}, [{'text': 'x'}])",
        url=worker.url,
        model=BROKEN,
    )
    assert error["type"] == "ModelLoadFailedError", error
    assert (error["code"], error["status_code"]) == ("MODEL_LOAD_FAILED", 502)
    assert (error["error_class"], error["permanent"], error["attempts"]) == ("ENGINE", False, 1)
    # other clients keep the worker's own code in the body
    response = loopback.post(
        worker.url + "/v1/score/" + BROKEN,
        json={"query": {"text": "q"}, "items": [{"text": "x"}]},
        timeout=300,
    )
    assert response.status_code == 502
    assert response.headers["x-sie-error-code"] == "MODEL_LOAD_FAILED"
    assert response.json()["error"]["code"] == "load_failed"


def test_a_wrong_request_raises_request_error_naming_the_field(
    sie_sdk: SdkRunner, worker: WorkerProcess
) -> None:
    error = sie_sdk.run(
        "result = error_of(SIEClient(url).generate, model, 'hi', max_new_tokens=500)",
        url=worker.url,
        model=LLAMA,
    )
    assert error["type"] == "RequestError"
    assert (error["status_code"], error["code"], error["param"]) == (
        400,
        "INVALID_INPUT",
        "max_new_tokens",
    )
    assert "max_output_tokens of 64" in error["message"]


def test_get_capacity_is_a_gateways_and_a_worker_refuses_it_as_sies_workers_do(
    sie_sdk: SdkRunner, worker: WorkerProcess
) -> None:
    error = sie_sdk.run("result = error_of(SIEClient(url).get_capacity)", url=worker.url)
    assert (error["type"], error["status_code"]) == ("RequestError", 404)
