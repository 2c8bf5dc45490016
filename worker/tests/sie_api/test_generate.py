"""SIE's generate: one /v1/completions request, its answer and its stream in SIE's shape."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.support.served_models import served

from sie_worker.errors import EngineUnavailable, InvalidRequest, UnknownModel
from sie_worker.sie_api.generate import StreamChunks, generate_call, parse_generate

GENERATE = {"generate": {"context_length": 128, "max_output_tokens": 16}}


def _call(body: dict[str, Any], **kwargs: Any) -> Any:
    model = kwargs.pop("model", None) or served(GENERATE)
    return generate_call(parse_generate({"prompt": "hi", "max_new_tokens": 4, **body}), model,
                         request_id="rid", started=0.0)  # fmt: skip


def test_the_engine_gets_an_openai_completion_and_routing_keys_stay_behind() -> None:
    call = _call(
        {"temperature": 0.2, "top_p": 0.9, "stop": "\n", "seed": 3, "logit_bias": {"11": -1},
         "routing_key": "r", "prompt_cache_key": "p", "safety_identifier": "s",
         "options": {"default_sampling": {}}}
    )  # fmt: skip
    assert call.path == "/v1/completions"
    assert call.payload == {
        "prompt": "hi", "max_tokens": 4, "temperature": 0.2, "top_p": 0.9, "stop": ["\n"],
        "seed": 3, "logit_bias": {"11": -1},
    }  # fmt: skip
    assert call.stream is False


def test_the_answer_is_sies_generate_shape() -> None:
    call = _call({})
    engine = {
        "choices": [{"text": "hello", "finish_reason": "length"}],
        "usage": {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6},
    }
    assert json.loads(call.answer(engine, "org/m").body) == {
        "model": "org/m",
        "text": "hello",
        "finish_reason": "length",
        "usage": {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6},
    }
    with pytest.raises(EngineUnavailable):
        call.answer({"choices": []}, "org/m")


@pytest.mark.parametrize(
    ("grammar", "field", "value"),
    [
        ({"regex": "[a-z]+"}, "regex", "[a-z]+"),
        ({"ebnf": 'root ::= "a"'}, "ebnf", 'root ::= "a"'),
        ({"json_schema": {"type": "object"}, "label": "x"}, "json_schema", '{"type": "object"}'),
    ],
)
def test_a_grammar_becomes_sglangs_field(grammar: dict[str, Any], field: str, value: str) -> None:
    assert _call({"grammar": grammar}).payload[field] == value


def test_a_grammar_kind_the_config_does_not_declare_is_refused() -> None:
    # SIE's tasks.generate.capabilities.grammar (the config reader may not know it yet)
    base = served(GENERATE)
    tasks = {"generate": {"capabilities": {"grammar": ["regex"]}}}
    model = replace(base, config=replace(base.config, tasks=tasks))
    with pytest.raises(InvalidRequest) as caught:
        _call({"grammar": {"ebnf": "x"}}, model=model)
    assert caught.value.param == "grammar.ebnf"


def test_lora_adapters_of_the_profile_are_passed_and_others_refused() -> None:
    lora = {"adapter_options": {"loadtime": {"lora_paths": {"legal": "org/legal-lora"}}}}
    model = served(GENERATE, profile="lora", lora=lora)
    assert _call({"lora_adapter": "legal"}, model=model).payload["lora_path"] == "legal"
    with pytest.raises(UnknownModel, match="its adapters: legal") as caught:
        _call({"lora_adapter": "medical"}, model=model)
    assert caught.value.param == "lora_adapter"
    with pytest.raises(UnknownModel, match="declares no LoRA adapters"):
        _call({"lora_adapter": "legal"})


def test_max_new_tokens_above_the_models_cap_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="max_output_tokens of 16") as caught:
        _call({"max_new_tokens": 17})
    assert caught.value.param == "max_new_tokens"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"prompt": ""}, "prompt"),
        ({"prompt": 3}, "prompt"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"max_new_tokens": None}, "max_new_tokens"),
        ({"max_new_tokens": True}, "max_new_tokens"),
        ({"temperature": "hot"}, "temperature"),
        ({"stop": ["ok", ""]}, "stop"),
        ({"stop": 3}, "stop"),
        ({"seed": 1.5}, "seed"),
        ({"logit_bias": {"1": "x"}}, "logit_bias"),
        ({"grammar": {"regex": "a", "ebnf": "b"}}, "grammar"),
        ({"grammar": {"json_schema": "{}"}}, "grammar.json_schema"),
        ({"grammar": {"regex": "a", "flavour": 1}}, "grammar.flavour"),
        ({"images": [{"data": "x"}]}, "images"),
        ({"logprobs": True}, "logprobs"),
        ({"stream": "yes"}, "stream"),
        ({"routing_key": 5}, "routing_key"),
        ({"n": 2}, "n"),
    ],
)
def test_a_wrong_body_is_refused_naming_the_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_generate({"prompt": "hi", "max_new_tokens": 4, **body})
    assert caught.value.param == field


def test_a_stream_asks_the_engine_for_usage() -> None:
    call = _call({"stream": True})
    assert call.stream is True
    assert call.payload["stream_options"] == {"include_usage": True}
    assert call.events is not None


def _chunk(
    text: str | None = None, finish: str | None = None, usage: dict[str, int] | None = None
) -> bytes:
    payload: dict[str, Any] = {"object": "text_completion", "choices": []}
    if text is not None or finish is not None:
        payload["choices"] = [{"index": 0, "text": text or "", "finish_reason": finish}]
    if usage is not None:
        payload["usage"] = usage
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


OPENAI_STREAM = (
    _chunk("Hel")
    + b": keep-alive\n\n"
    + _chunk("lo")
    + _chunk("", "stop")
    + _chunk(usage={"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5})
    + b"data: [DONE]\n\n"
)


def _sie_events(raw: bytes) -> list[Any]:
    lines = [line for line in raw.split(b"\n") if line]
    return [line.decode() if line.startswith(b":") else line[6:].decode() for line in lines]


def test_a_stream_becomes_sies_events_ending_with_done() -> None:
    events = _sie_events(StreamChunks("rid", started=0.0)(OPENAI_STREAM))
    assert events[1] == ": keep-alive"
    assert events[-1] == "[DONE]"
    parsed = [json.loads(e) for e in events if not e.startswith(":") and e != "[DONE]"]
    assert [e["text_delta"] for e in parsed] == ["Hel", "lo", ""]
    assert [e["seq"] for e in parsed] == [0, 1, 2]
    assert {e["request_id"] for e in parsed} == {"rid"}
    *deltas, last = parsed
    assert all(e["done"] is False for e in deltas)
    assert last["done"] is True
    assert last["finish_reason"] == "stop"
    assert last["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    assert last["ttft_ms"] >= 0


@given(st.lists(st.integers(min_value=0, max_value=len(OPENAI_STREAM)), max_size=6))
def test_the_events_are_the_same_however_the_engine_batches_them(cuts: list[int]) -> None:
    # the relay hands over whole events only: cut at event boundaries
    boundaries = sorted({c for c in cuts if OPENAI_STREAM[:c].endswith(b"\n\n")})
    pieces = [
        OPENAI_STREAM[a:b]
        for a, b in zip([0, *boundaries], [*boundaries, len(OPENAI_STREAM)], strict=True)
    ]
    translator = StreamChunks("rid", started=0.0)
    batched = b"".join(translator(piece) for piece in pieces)
    whole = StreamChunks("rid", started=0.0)(OPENAI_STREAM)
    strip = [
        json.loads(e) | {"ttft_ms": 0} if e.startswith("{") else e for e in _sie_events(batched)
    ]
    assert strip == [
        json.loads(e) | {"ttft_ms": 0} if e.startswith("{") else e for e in _sie_events(whole)
    ]


def test_an_error_event_passes_through_as_it_is() -> None:
    error = b'data: {"error": {"code": "engine_unavailable", "message": "gone"}}\n\n'
    assert StreamChunks("rid", started=0.0)(_chunk("a") + error).endswith(error)


def test_an_event_that_is_not_json_fails_the_stream() -> None:
    with pytest.raises(EngineUnavailable):
        StreamChunks("rid", started=0.0)(b"data: {nope\n\n")
