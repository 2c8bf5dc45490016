"""SIE's native API on a real worker with fake SGLang engines behind it: the same request
path as the OpenAI routes (ids, grammar routing, loading, auth, limits, metrics, errors)."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from typing import Any

import httpx
import msgpack
import pytest
from tests.support import loopback
from tests.support.fake_engine import fake_embedding
from tests.support.worker_fixtures import WorkerProcess, fake_model

StartWorker = Callable[..., WorkerProcess]
MSGPACK = {"content-type": "application/msgpack", "accept": "application/msgpack"}
_DIM = 16  # the fake engine's embedding width


def _encode(client: httpx.Client, model: str, body: dict[str, Any]) -> httpx.Response:
    return client.post(f"/v1/encode/{model}", content=msgpack.packb(body), headers=MSGPACK)


def _vector(values: Any) -> list[float]:
    assert values[b"type"] == "<f4"
    return list(struct.unpack(f"<{values[b'shape'][0]}f", values[b"data"]))


def test_encode_on_sglang_answers_msgpack_vectors_of_the_texts_the_worker_shaped(
    start_worker: StartWorker,
) -> None:
    runtime = {"query_template": "query: {text}", "doc_template": "passage: {text}"}
    profiles = {"e5": {"extends": "default", "adapter_options": {"runtime": runtime}}}
    worker = start_worker([fake_model("org/emb", task="encode", profiles=profiles)])
    with worker.client() as client:
        items = [{"id": "a", "text": "hello"}, {"id": "b", "text": "world"}]
        plain = _encode(client, "org/emb", {"items": items})
        assert plain.status_code == 200, plain.text
        assert plain.headers["content-type"] == "application/msgpack"
        body = msgpack.unpackb(plain.content, raw=False)
        assert [i["id"] for i in body["items"]] == ["a", "b"]
        for item, text in zip(body["items"], ("hello", "world"), strict=True):
            assert item["dense"]["dims"] == _DIM
            assert _vector(item["dense"]["values"]) == pytest.approx(fake_embedding(text, _DIM))
        options: dict[str, Any] = {"is_query": True}
        query = {"items": [{"text": "hello"}], "params": {"options": options}}
        shaped = msgpack.unpackb(_encode(client, "org/emb:e5", query).content, raw=False)
        expected = fake_embedding("query: hello", _DIM)
        assert _vector(shaped["items"][0]["dense"]["values"]) == pytest.approx(expected)
        # the profile named in the body instead of the path
        options["profile"] = "e5"
        shaped = msgpack.unpackb(_encode(client, "org/emb", query).content, raw=False)
        assert _vector(shaped["items"][0]["dense"]["values"]) == pytest.approx(expected)


def test_encode_answers_json_to_a_client_that_asks_for_json(start_worker: StartWorker) -> None:
    worker = start_worker([fake_model("org/emb", task="encode")], devices="cuda:0")
    with worker.client() as client:
        response = client.post(
            "/v1/encode/org/emb",
            json={"items": [{"text": "hello"}], "params": {"output_dtype": "float16"}},
            headers={"accept": "application/json"},
        )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    dense = response.json()["items"][0]["dense"]
    assert dense["dtype"] == "float16"
    assert dense["values"] == pytest.approx(fake_embedding("hello", _DIM), abs=1e-3)


def test_generate_resolves_sies_ids_and_sends_the_engine_its_served_name(
    start_worker: StartWorker,
) -> None:
    # The fake engine reads "org/gen:default" as a LoRA adapter request, as SGLang does.
    worker = start_worker([fake_model("org/gen", profiles={"fast": {"extends": "default"}})])
    with worker.client() as client:
        for path, body in (
            ("/v1/generate/org__gen", {}),
            ("/v1/generate/org__gen:default", {}),
            ("/v1/generate/ORG__Gen", {}),
            ("/v1/generate/org/gen", {}),
            ("/v1/generate/org__gen", {"options": {"profile": "fast"}}),
        ):
            response = client.post(path, json={"prompt": "a b c", "max_new_tokens": 3, **body})
            assert response.status_code == 200, (path, response.text)
            answer = response.json()
            assert answer["text"] == "a b c"
            assert answer["finish_reason"] == "length"
            assert answer["usage"] == {
                "prompt_tokens": 3,
                "completion_tokens": 3,
                "total_tokens": 6,
            }
        models = worker.models()
    assert models["org/gen"]["state"] == "ready"
    assert models["org/gen:fast"]["state"] == "ready"


def test_stream_generate_sends_sies_chunks_ending_with_done(start_worker: StartWorker) -> None:
    worker = start_worker([fake_model("org/gen")], devices="cuda:0")
    body = {"prompt": "one two", "max_new_tokens": 4, "stream": True}
    with (
        worker.client() as client,
        client.stream("POST", "/v1/generate/org__gen", json=body) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(line[6:]) for line in lines[:-1]]
    *deltas, last = events
    assert "".join(e["text_delta"] for e in deltas) == "one two one two"
    assert [e["seq"] for e in events] == list(range(len(events)))
    assert last["done"] is True
    assert last["finish_reason"] == "length"
    assert last["usage"] == {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6}


def test_a_grammar_goes_to_the_grammar_profile_as_on_the_openai_routes(
    start_worker: StartWorker,
) -> None:
    config = {
        **fake_model("org/g", profiles={"structured": {"extends": "default"}}),
        "grammar_profile": "structured",
    }
    worker = start_worker([config])
    with worker.client() as client:
        body = {"prompt": "x", "max_new_tokens": 2, "grammar": {"regex": "[a-z]+"}}
        assert client.post("/v1/generate/org__g", json=body).status_code == 200
    models = worker.models()
    assert (models["org/g:structured"]["state"], models["org/g"]["state"]) == ("ready", "unloaded")


def test_models_carry_sies_list_beside_openais_and_the_detail_in_sies_words(
    start_worker: StartWorker,
) -> None:
    worker = start_worker([fake_model("org/gen"), fake_model("org/emb", task="encode")])
    with worker.client() as client:
        assert client.post("/v1/models/org/gen/load").status_code == 200
        listing = client.get("/v1/models").json()
        detail = client.get("/v1/models/ORG/GEN").json()
        missing = client.get("/v1/models/org/nope")
    assert {m["id"] for m in listing["data"]} == {"org/gen", "org/emb"}
    infos = {m["name"]: m for m in listing["models"]}
    assert (infos["org/gen"]["state"], infos["org/gen"]["loaded"]) == ("loaded", True)
    assert (infos["org/emb"]["state"], infos["org/emb"]["outputs"]) == ("available", ["dense"])
    assert detail["id"] == "org/gen"
    assert (detail["state"], detail["worker_state"], detail["loaded"]) == ("loaded", "ready", True)
    assert detail["devices"] == ["cuda:0"]
    assert missing.status_code == 404
    assert missing.headers["x-sie-error-code"] == "MODEL_NOT_FOUND"


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "sie_code"),
    [
        ("POST", "/v1/encode/org/nope", {"items": [{"text": "x"}]}, 404, "MODEL_NOT_FOUND"),
        (
            "POST",
            "/v1/generate/org__nope",
            {"prompt": "x", "max_new_tokens": 1},
            404,
            "MODEL_NOT_FOUND",
        ),
        (
            "POST",
            "/v1/chat/completions",
            {"model": "org/nope", "messages": []},
            404,
            "MODEL_NOT_FOUND",
        ),
        ("POST", "/v1/encode/org/gen", {"items": [{"text": "x"}]}, 400, "INVALID_INPUT"),
        (
            "POST",
            "/v1/score/org/gen",
            {"query": {"text": "q"}, "items": [{"text": "x"}]},
            400,
            "INVALID_INPUT",
        ),
        ("POST", "/v1/generate/org__gen", {"prompt": "x"}, 400, "INVALID_INPUT"),
        ("GET", "/v1/encode/org/gen", None, 405, "METHOD_NOT_ALLOWED"),
        ("GET", "/v1/nothing-here", None, 404, "NOT_FOUND"),
        ("POST", "/v1/encode", {"items": [{"text": "x"}]}, 404, "NOT_FOUND"),  # no redirect
    ],
)
def test_every_error_carries_sies_code_and_a_json_body_whatever_the_accept(
    start_worker: StartWorker,
    method: str,
    path: str,
    body: dict[str, Any] | None,
    status: int,
    sie_code: str,
) -> None:
    worker = start_worker([fake_model("org/gen")], devices="cuda:0")
    with worker.client() as client:
        response = client.request(
            method, path, json=body, headers={"accept": "application/msgpack"}
        )
    assert response.status_code == status, response.text
    assert response.headers["x-sie-error-code"] == sie_code
    assert response.headers["content-type"] == "application/json"
    assert isinstance(response.json()["error"]["message"], str)


def test_auth_limits_and_metrics_are_the_openai_routes_own(start_worker: StartWorker) -> None:
    worker = start_worker(
        [fake_model("org/emb", task="encode")],
        devices="cuda:0",
        api_key="s3cret",
        env={"SIE_MAX_BODY_BYTES": "2048"},
    )
    anonymous = loopback.post(worker.url + "/v1/encode/org/emb", json={"items": [{"text": "x"}]})
    assert (anonymous.status_code, anonymous.headers["x-sie-error-code"]) == (401, "UNAUTHORIZED")
    with worker.client() as client:
        big = client.post("/v1/encode/org/emb", json={"items": [{"text": "x" * 4096}]})
        assert (big.status_code, big.headers["x-sie-error-code"]) == (413, "PAYLOAD_TOO_LARGE")
        assert _encode(client, "org/emb", {"items": [{"text": "x"}]}).status_code == 200
        metrics = client.get("/metrics").text
    assert (
        'sie_request_duration_seconds_count{adapter="none",code="200",model="org/emb"} 1.0'
        in metrics
    )


def test_a_load_longer_than_the_client_waits_answers_503_model_loading_with_retry_after(
    start_worker: StartWorker,
) -> None:
    worker = start_worker(
        [fake_model("org/slow", env={"FAKE_ENGINE_START_DELAY_S": "3"})], devices="cuda:0"
    )
    with worker.client() as client:
        response = client.post(
            "/v1/generate/org__slow",
            json={"prompt": "x", "max_new_tokens": 1},
            headers={"prefer": "wait=0.2", "x-sie-sdk-version": "0.10.1"},
        )
    assert response.status_code == 503
    assert response.headers["x-sie-error-code"] == "MODEL_LOADING"
    assert response.headers["retry-after"] == "5"
    assert "still loading" in response.json()["error"]["message"]


def test_openai_routes_resolve_sies_ids_and_refuse_an_unknown_lora_adapter(
    start_worker: StartWorker,
) -> None:
    # sie-sdk's chat_completions sends its model id, profile suffix and lora_adapter as given
    worker = start_worker([fake_model("org/gen")], devices="cuda:0")
    messages = [{"role": "user", "content": "a b"}]
    with worker.client() as client:
        for model in ("org/gen:default", "ORG/GEN"):
            response = client.post(
                "/v1/chat/completions", json={"model": model, "messages": messages, "max_tokens": 2}
            )
            assert response.status_code == 200, (model, response.text)
        refused = client.post(
            "/v1/chat/completions",
            json={"model": "org/gen", "messages": messages, "lora_adapter": "legal"},
        )
    assert refused.status_code == 404
    assert refused.headers["x-sie-error-code"] == "MODEL_NOT_FOUND"
    assert refused.json()["error"]["param"] == "lora_adapter"
    assert "org/gen has no LoRA adapter 'legal'" in refused.json()["error"]["message"]
