"""Runtime options: the read-time rules, and the request body a profile's options make."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sie_worker.config.files.reader import parse_config
from sie_worker.config.model import served_models
from sie_worker.config.runtime import (
    GRAMMAR_SAMPLING,
    SAMPLING_FIELDS,
    RequestRuntime,
    Timeouts,
    is_grammar_constrained,
    request_runtime,
    runtime_problems,
)

CHAT, COMPLETIONS, EMBEDDINGS = "/v1/chat/completions", "/v1/completions", "/v1/embeddings"


def _problems(runtime: dict[str, Any]) -> dict[str, str]:
    return {p.path: p.message for p in runtime_problems(runtime, ("profiles", "p", "runtime"))}


def test_sie_s_sampling_defaults_stops_and_timeouts_pass() -> None:
    runtime = {
        "default_sampling": {
            "temperature": 0.0,
            "top_p": 1.0,
            "top_k": 20,
            "presence_penalty": 1.5,
            "frequency_penalty": -2,
            "min_new_tokens": 0,
            "seed": -(2**63),
        },
        "stop_tokens": ["<|im_end|>", "<|endoftext|>"],
        "first_chunk_timeout_s": 30,
        "inter_chunk_timeout_s": 0.5,
        "overall_timeout_s": 1800,
        "schema_in_prompt": False,  # the adapter's; passed over
    }
    assert _problems(runtime) == {}


@pytest.mark.parametrize(
    ("runtime", "says"),
    [
        (
            {"default_sampling": {"temperature": -0.1}},
            "temperature must be a finite number of at least 0",
        ),
        ({"default_sampling": {"top_p": 0}}, "top_p must be a number above 0"),
        (
            {"default_sampling": {"presence_penalty": 2.5}},
            "presence_penalty must be a number from -2 to 2",
        ),
        ({"default_sampling": {"top_k": 1.5}}, "top_k must be an integer of at least 1"),
        (
            {"default_sampling": {"min_new_tokens": -1}},
            "min_new_tokens must be an integer of at least 0",
        ),
        ({"default_sampling": {"seed": 2**63}}, "seed must be a 64-bit integer"),
        ({"default_sampling": {"min_p": 0.1}}, "'min_p' is not a sampling default SIE applies"),
        ({"default_sampling": {"temprature": 0.1}}, "did you mean temperature?"),
        ({"default_sampling": [0.7]}, "must be a mapping"),
        ({"stop_tokens": "</s>"}, "must be a list of nonempty strings"),
        ({"stop_tokens": ["</s>", ""]}, "item 1 is a string ''"),
        ({"first_chunk_timeout_s": 0}, "above zero, got 0"),
        ({"inter_chunk_timeout_s": "15"}, "got a string '15'"),
        ({"overall_timeout_s": 2.0**64}, "above zero"),
        ({"overall_timeout_s": True}, "got a boolean"),
    ],
)
def test_bad_runtime_options_are_refused_where_written(runtime: dict[str, Any], says: str) -> None:
    [(path, message)] = _problems(runtime).items()
    assert path == f"$.profiles.p.runtime.{next(iter(runtime))}"
    assert says in message


def test_defaults_fill_only_what_the_client_left_unset() -> None:
    runtime = RequestRuntime(
        default_sampling={"temperature": 0.7, "top_p": 0.8, "min_new_tokens": 10}
    )
    out = runtime.apply(COMPLETIONS, {"prompt": "x", "temperature": 0, "top_p": None})
    assert out == {"prompt": "x", "temperature": 0, "top_p": 0.8, "min_tokens": 10}


def test_a_profile_minimum_is_clamped_to_the_request_s_maximum() -> None:
    runtime = RequestRuntime(default_sampling={"min_new_tokens": 10})
    assert runtime.apply(CHAT, {"max_tokens": 4})["min_tokens"] == 4
    assert runtime.apply(CHAT, {"max_completion_tokens": 3, "max_tokens": 9})["min_tokens"] == 3


@pytest.mark.parametrize(
    "body",
    [
        {"response_format": {"type": "json_schema", "json_schema": {}}},
        {"response_format": {"type": "json_object"}},
        {"regex": "(yes|no)"},
        {"ebnf": "root ::= 'x'"},
    ],
)
def test_grammar_requests_sample_greedily_above_the_profile_defaults(body: dict[str, Any]) -> None:
    assert is_grammar_constrained(body)
    runtime = RequestRuntime(default_sampling={"temperature": 0.7, "top_p": 0.8})
    out = runtime.apply(CHAT, body)
    assert out["temperature"] == 0.0
    assert out["top_p"] == 0.8
    assert {k: out[k] for k in GRAMMAR_SAMPLING} == dict(GRAMMAR_SAMPLING)
    assert runtime.apply(CHAT, {**body, "temperature": 0.3})["temperature"] == 0.3


def test_text_response_format_is_not_a_grammar() -> None:
    assert not is_grammar_constrained({"response_format": {"type": "text"}})
    assert not is_grammar_constrained({"regex": None})


@pytest.mark.parametrize(
    ("stop", "expected"),
    [
        (None, ["<|im_end|>", "</s>"]),
        ("END", ["END", "<|im_end|>", "</s>"]),
        (["</s>", "END"], ["</s>", "END", "<|im_end|>"]),
        (42, 42),  # not a stop the worker understands: the engine says what is wrong
    ],
)
def test_stop_tokens_are_added_once(stop: Any, expected: Any) -> None:
    runtime = RequestRuntime(stop_tokens=("<|im_end|>", "</s>"))
    body = {} if stop is None else {"stop": stop}
    assert runtime.apply(COMPLETIONS, body)["stop"] == expected


def test_chat_requests_get_the_config_s_template_arguments_over_their_own() -> None:
    runtime = RequestRuntime(chat_template_kwargs={"enable_thinking": False})
    own = {"chat_template_kwargs": {"enable_thinking": True, "custom": 1}}
    assert runtime.apply(CHAT, own)["chat_template_kwargs"] == {
        "enable_thinking": False,
        "custom": 1,
    }
    assert "chat_template_kwargs" not in runtime.apply(COMPLETIONS, {})


def test_bodies_are_forwarded_as_sent_when_nothing_applies() -> None:
    body = b'{"model": "m", "prompt": "x"}'
    assert RequestRuntime().rewrite(COMPLETIONS, body) is body
    runtime = RequestRuntime(stop_tokens=("</s>",))
    assert runtime.rewrite(EMBEDDINGS, body) is body
    assert runtime.rewrite(COMPLETIONS, b"not json") == b"not json"
    assert runtime.rewrite(COMPLETIONS, b"[1]") == b"[1]"
    assert json.loads(runtime.rewrite(COMPLETIONS, body))["stop"] == ["</s>"]


@given(
    sampling=st.dictionaries(
        st.sampled_from(sorted(SAMPLING_FIELDS)), st.integers(0, 5), max_size=7
    ),
    request=st.dictionaries(
        st.sampled_from(sorted(SAMPLING_FIELDS.values())), st.integers(0, 5), max_size=7
    ),
)
def test_request_values_always_win_and_nothing_else_changes(
    sampling: dict[str, int], request: dict[str, int]
) -> None:
    out = RequestRuntime(default_sampling=sampling).apply(COMPLETIONS, {"prompt": "p", **request})
    assert out["prompt"] == "p"
    for field, value in request.items():
        assert out[field] == value
    assert set(out) - set(request) - {"prompt"} <= {SAMPLING_FIELDS[k] for k in sampling}


def test_a_served_model_s_runtime_comes_from_its_profile() -> None:
    doc = {
        "sie_id": "org/m",
        "hf_id": "org/m",
        "tasks": {
            "generate": {"context_length": 8192, "chat_template_kwargs": {"enable_thinking": False}}
        },
        "profiles": {
            "default": {
                "adapter_options": {
                    "loadtime": {"stop_tokens": ["</s>"]},
                    "runtime": {"default_sampling": {"temperature": 0.7}, "overall_timeout_s": 600},
                }
            },
            "thinking": {"extends": "default", "chat_template_kwargs": {"enable_thinking": True}},
        },
    }
    default, thinking = (request_runtime(s) for s in served_models(parse_config(doc, source="m")))
    assert default.default_sampling == {"temperature": 0.7}
    assert default.stop_tokens == ("</s>",)  # SIE's loadtime spelling, under the runtime one
    assert default.timeouts == Timeouts(overall_s=600.0)
    assert default.chat_template_kwargs == {"enable_thinking": False}
    assert thinking.chat_template_kwargs == {"enable_thinking": True}
    assert thinking.timeouts == default.timeouts
