"""SIE's encode: the request read, the engine request it becomes, the answer it gets."""

from __future__ import annotations

import base64
import json
import struct
from typing import Any

import msgpack
import pytest
from tests.support.served_models import served

from sie_worker.engines.registry import family_of
from sie_worker.errors import EngineUnavailable, InvalidRequest, UnknownModel
from sie_worker.sie_api.encode import encode_call, parse_encode

ENCODE = {"encode": {"dimensions": 2}}


def _engine_answer(*vectors: tuple[float, float], tokens: int = 7) -> dict[str, Any]:
    data = [
        {"index": i, "embedding": base64.b64encode(struct.pack("<2f", *v)).decode()}
        for i, v in enumerate(vectors)
    ]
    return {"data": list(reversed(data)), "usage": {"prompt_tokens": tokens}}


def test_a_batch_gets_one_vector_per_item_in_order_with_its_id() -> None:
    request = parse_encode({"items": [{"id": "a", "text": "x"}, {"text": "y"}]})
    call = encode_call(
        request, served(ENCODE), family=family_of("transformers"), as_json=False, headers={}
    )
    assert call.path == "/v1/embeddings"
    assert call.payload["input"] == ["x", "y"]
    assert call.payload["encoding_format"] == "base64"
    assert call.answer is not None
    response = call.answer(_engine_answer((1, 0), (0, 1)), "org/m")
    body = msgpack.unpackb(response.body, raw=False)
    assert body["model"] == "org/m"
    assert body["usage"] == {"input_tokens": 7}
    first, second = body["items"]
    assert first["id"] == "a"
    assert "id" not in second
    assert first["dense"]["dims"] == 2
    assert first["dense"]["dtype"] == "float32"
    assert struct.unpack("<2f", first["dense"]["values"][b"data"]) == (1.0, 0.0)
    assert struct.unpack("<2f", second["dense"]["values"][b"data"]) == (0.0, 1.0)


def test_a_json_answer_holds_the_vectors_as_numbers() -> None:
    call = encode_call(
        parse_encode({"items": [{"text": "x"}]}),
        served(ENCODE),
        family=family_of("sglang"),
        as_json=True,
        headers={},
    )
    assert call.answer is not None
    body = json.loads(call.answer({"data": [{"index": 0, "embedding": [0.5, 0.25]}]}, "org/m").body)
    assert body["items"][0]["dense"]["values"] == [0.5, 0.25]
    assert body["usage"] == {"input_tokens": 0}


def test_the_default_engine_gets_is_query_instruction_and_the_profiles_text_options() -> None:
    model = served(
        ENCODE,
        profile="e5",
        e5={
            "adapter_options": {"runtime": {"query_template": "query: {text}", "normalize": False}}
        },
    )
    request = parse_encode(
        {
            "items": [{"text": "x"}, {"text": "y"}],
            "params": {
                "instruction": "Find",
                "options": {"is_query": True, "doc_template": "d: {text}"},
            },
        }
    )
    payload = encode_call(
        request, model, family=family_of("transformers"), as_json=False, headers={}
    ).payload
    assert payload["is_query"] == [True, True]
    assert payload["instruction"] == ["Find", "Find"]
    assert payload["query_template"] == "query: {text}"
    assert payload["doc_template"] == "d: {text}"
    assert payload["normalize"] is False


def test_an_sglang_engine_gets_the_finished_texts() -> None:
    model = served(
        ENCODE, profile="e5", e5={"adapter_options": {"runtime": {"query_template": "q: {text}"}}}
    )
    query = parse_encode({"items": [{"text": "x"}], "params": {"options": {"is_query": True}}})
    document = parse_encode({"items": [{"text": "x"}], "params": {"instruction": "Represent"}})
    assert encode_call(query, model, family=family_of("sglang"), as_json=False, headers={}).payload[
        "input"
    ] == ["q: x"]
    assert encode_call(
        document, model, family=family_of("sglang"), as_json=False, headers={}
    ).payload["input"] == ["Represent x"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ([], "body"),
        ({}, "items"),
        ({"items": []}, "items"),
        ({"items": "x"}, "items"),
        ({"items": [{"id": "a"}]}, "items[0].text"),
        ({"items": [{"text": 1}]}, "items[0].text"),
        ({"items": [{"text": "x", "id": 3}]}, "items[0].id"),
        ({"items": [{"text": "x", "images": [{"data": b"x"}]}]}, "items[0].images"),
        ({"items": [{"text": "x", "colour": 1}]}, "items[0].colour"),
        ({"items": [{"text": "x"}], "extra": 1}, "extra"),
        ({"items": [{"text": "x"}], "params": []}, "params"),
        ({"items": [{"text": "x"}], "params": {"top_k": 1}}, "params.top_k"),
        ({"items": [{"text": "x"}], "params": {"output_dtype": "int4"}}, "params.output_dtype"),
        ({"items": [{"text": "x"}], "params": {"output_types": []}}, "params.output_types"),
        ({"items": [{"text": "x"}], "params": {"output_types": ["colour"]}}, "params.output_types"),
        ({"items": [{"text": "x"}], "params": {"instruction": 1}}, "params.instruction"),
        (
            {"items": [{"text": "x"}], "params": {"options": {"is_query": "yes"}}},
            "params.options.is_query",
        ),
        (
            {"items": [{"text": "x"}], "params": {"options": {"lora": 3}}},
            "params.options.lora",
        ),
        ({"items": [{"text": "x"}], "params": {"options": {1: 2}}}, "params.options"),
    ],
)
def test_a_wrong_body_is_refused_naming_the_field(body: object, field: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_encode(body)
    assert caught.value.param == field
    assert caught.value.message.startswith(field)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"query_template": "{query}"}, "params.options.query_template"),
        ({"doc_template": 3}, "params.options.doc_template"),
        ({"normalize": "no"}, "params.options.normalize"),
    ],
)
def test_wrong_text_options_are_refused_naming_where_they_were_written(
    options: dict[str, Any], field: str
) -> None:
    request = parse_encode({"items": [{"text": "x"}], "params": {"options": options}})
    with pytest.raises(InvalidRequest) as caught:
        encode_call(
            request, served(ENCODE), family=family_of("transformers"), as_json=False, headers={}
        )
    assert caught.value.param == field


def test_a_profile_template_that_is_wrong_is_refused_naming_the_config_path() -> None:
    model = served(
        ENCODE, profile="bad", bad={"adapter_options": {"runtime": {"doc_template": "{x}"}}}
    )
    request = parse_encode({"items": [{"text": "x"}]})
    with pytest.raises(InvalidRequest) as caught:
        encode_call(request, model, family=family_of("transformers"), as_json=False, headers={})
    assert caught.value.param == "profiles.bad.adapter_options.runtime.doc_template"


def test_outputs_other_than_dense_and_models_that_do_not_encode_are_refused() -> None:
    sparse = parse_encode(
        {"items": [{"text": "x"}], "params": {"output_types": ["dense", "sparse"]}}
    )
    with pytest.raises(InvalidRequest, match="'sparse' is not an output of org/m") as caught:
        encode_call(
            sparse, served(ENCODE), family=family_of("transformers"), as_json=False, headers={}
        )
    assert caught.value.param == "params.output_types"
    plain = parse_encode({"items": [{"text": "x"}]})
    with pytest.raises(InvalidRequest, match="does not serve /v1/encode"):
        encode_call(
            plain, served({"generate": {}}), family=family_of("sglang"), as_json=False, headers={}
        )


@pytest.mark.parametrize(
    "engine_answer",
    [
        {},
        {"data": []},
        {"data": [{"index": 0, "embedding": "!!"}]},
        {"data": [{"index": 0, "embedding": [1.0]}, {"index": 1, "embedding": [1.0]}]},
    ],
)
def test_an_engine_answer_without_one_vector_per_item_is_the_engines_failure(
    engine_answer: dict[str, Any],
) -> None:
    call = encode_call(
        parse_encode({"items": [{"text": "x"}]}),
        served(ENCODE),
        family=family_of("sglang"),
        as_json=False,
        headers={},
    )
    assert call.answer is not None
    with pytest.raises(EngineUnavailable):
        call.answer(engine_answer, "org/m")


def test_options_lora_id_or_lora_names_the_adapter_the_engine_gets_as_lora_path() -> None:
    loadtime = {"lora_paths": {"legal": "org/legal-lora", "med": "org/med-lora"}}
    model = served(ENCODE, profile="lora", lora={"adapter_options": {"loadtime": loadtime}})

    def call(options: dict[str, Any]) -> Any:
        request = parse_encode({"items": [{"text": "x"}], "params": {"options": options}})
        return encode_call(
            request, model, family=family_of("sglang"), as_json=False, headers={}
        ).payload

    assert call({"lora": "legal"})["lora_path"] == "legal"
    assert call({"lora": "legal", "lora_id": "med"})["lora_path"] == "med"  # lora_id wins
    assert "lora_path" not in call({})
    with pytest.raises(UnknownModel, match="its adapters: legal, med") as caught:
        call({"lora_id": "tax"})
    assert caught.value.param == "params.options.lora_id"
