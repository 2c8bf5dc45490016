"""The continuation of a broken stream: what the next backend is asked, and how its
events are rewritten into the first answer."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sie_worker.http.relay import Upstream
from sie_worker.http.resume import Plan, Resumer, Rewrite, opted_out, plan, refusal_reason
from sie_worker.http.stream_memory import DONE_EVENT, StreamMemory


def _event(document: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(document).encode() + b"\n\n"


def _memory(chat: bool, *pieces: str, finish: str | None = None) -> StreamMemory:
    memory = StreamMemory("chat" if chat else "completions")
    ident = {"id": "first", "created": 1, "model": "m"}
    if chat:
        role = {"index": 0, "delta": {"role": "assistant", "content": ""}}
        memory.feed(_event(ident | {"choices": [role]}))
    for piece in pieces:
        choice = {"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece}
        memory.feed(_event(ident | {"choices": [choice]}))
    if finish is not None:
        choice = {"index": 0, "delta": {}} if chat else {"index": 0, "text": ""}
        memory.feed(_event(ident | {"choices": [choice | {"finish_reason": finish}]}))
    return memory


def _planned(request: dict[str, Any], memory: StreamMemory) -> tuple[dict[str, Any], Rewrite]:
    planned = plan(json.dumps(request).encode(), memory)
    assert isinstance(planned, Plan)
    assert planned.body is not None
    return json.loads(planned.body), planned.rewrite


def test_a_completion_continues_from_its_prompt_and_the_text_sent() -> None:
    request = {"model": "m", "prompt": "once", "stream": True, "max_tokens": 8, "min_tokens": 4}
    body, _ = _planned(request, _memory(False, " upon", " a", " time"))
    assert body["prompt"] == "once upon a time"
    assert body["max_tokens"] == 5
    assert body["min_tokens"] == 1


def test_a_chat_continues_the_partial_assistant_message() -> None:
    messages = [{"role": "user", "content": "hi"}]
    request = {"model": "m", "messages": messages, "stream": True, "max_completion_tokens": 8}
    body, rewrite = _planned(request, _memory(True, " hello", " there"))
    assert body["messages"] == [*messages, {"role": "assistant", "content": " hello there"}]
    assert body["continue_final_message"] is True
    assert body["add_generation_prompt"] is False
    assert body["max_completion_tokens"] == 6
    assert rewrite.drop_role


def test_a_chat_that_continued_a_message_itself_extends_that_message() -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Well,"}]
    request = {"messages": messages, "stream": True, "continue_final_message": True}
    body, _ = _planned(request, _memory(True, " then"))
    assert body["messages"][-1] == {"role": "assistant", "content": "Well, then"}
    assert len(body["messages"]) == 2


def test_a_stream_broken_before_any_text_is_sent_again_as_it_came() -> None:
    original = json.dumps({"prompt": "p", "stream": True}).encode()
    planned = plan(original, StreamMemory("completions"))
    assert isinstance(planned, Plan)
    assert planned.body == original


def test_a_stream_missing_only_done_needs_no_backend() -> None:
    request = {"prompt": "p", "stream": True}
    planned = plan(json.dumps(request).encode(), _memory(False, " a", finish="stop"))
    assert isinstance(planned, Plan)
    assert planned.body is None


def test_a_stream_missing_its_usage_asks_one_token_and_keeps_only_the_usage() -> None:
    request = {"prompt": "p", "stream": True, "stream_options": {"include_usage": True}}
    request["max_tokens"] = 2
    body, rewrite = _planned(request, _memory(False, " a", " b", finish="length"))
    assert body["max_tokens"] == 1
    assert body["prompt"] == "p a b"
    token = {"id": "x", "created": 9, "choices": [{"index": 0, "text": " c"}]}
    finish = {"id": "x", "choices": [{"index": 0, "text": "", "finish_reason": "length"}]}
    usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
    out = rewrite(
        _event(token) + _event(finish) + _event({"id": "x", "choices": [], "usage": usage})
    )
    documents = [json.loads(e.removeprefix(b"data: ")) for e in out.split(b"\n\n") if e]
    assert documents == [
        {
            "id": "first",
            "choices": [],
            "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
        }
    ]


def test_the_continuation_is_rewritten_into_the_first_answer() -> None:
    rewrite = Rewrite({"id": "first", "created": 1, "model": "m"}, 3, "chat", drop_role=True)
    role = {
        "id": "x",
        "created": 9,
        "model": "m",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
    }
    token = {
        "id": "x",
        "created": 9,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": " d"}}],
    }
    usage = {"id": "x", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 2}}
    out = rewrite(_event(role) + _event(token) + _event(usage) + DONE_EVENT)
    events = [e for e in out.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    documents = [json.loads(e.removeprefix(b"data: ")) for e in events[:-1]]
    assert documents[0] == {
        "id": "first",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": " d"}}],
    }
    # The prompt less the 3 tokens it carried over; those 3 plus the 2 new ones.
    assert documents[1]["usage"] == {"prompt_tokens": 4, "completion_tokens": 5, "total_tokens": 9}


@pytest.mark.parametrize(
    ("request_body", "why"),
    [
        ({"prompt": "p", "stream": True, "n": 2}, "several choices"),
        ({"prompt": "p", "stream": True, "echo": True}, "echoed"),
        ({"prompt": [1, 2, 3], "stream": True}, "not one text"),
        ({"prompt": "p"}, "not a stream"),
    ],
)
def test_what_cannot_be_continued_says_why(request_body: dict[str, Any], why: str) -> None:
    planned = plan(json.dumps(request_body).encode(), _memory(False, " a"))
    assert isinstance(planned, str)
    assert why in planned


def test_the_header_opts_a_request_out() -> None:
    assert opted_out([("X-SIE-Resume", "off")])
    assert opted_out([("x-sie-resume", " OFF ")])
    assert not opted_out([("x-sie-resume", "on")])
    assert not opted_out([])


def test_only_the_workers_refusals_before_any_event_are_sent_again() -> None:
    assert refusal_reason(409, [("x-sie-error-code", "NOT_LEADER")]) == "not_leader"
    assert refusal_reason(502, [("X-SIE-Error-Code", "INFERENCE_ERROR")]) == "engine_failed"
    assert refusal_reason(404, [("x-sie-error-code", "MODEL_NOT_FOUND")]) is None
    assert refusal_reason(200, []) is None


@pytest.mark.parametrize(
    ("method", "target", "headers", "resume_max", "resumable"),
    [
        ("POST", "/v1/completions", [], 2, True),
        ("POST", "/v1/chat/completions?x=1", [], 2, True),
        ("POST", "/v1/embeddings", [], 2, False),
        ("GET", "/v1/completions", [], 2, False),
        ("POST", "/v1/completions", [], 0, False),
        ("POST", "/v1/completions", [("x-sie-resume", "off")], 2, False),
    ],
)
def test_which_requests_a_hop_may_resume(
    method: str, target: str, headers: list[tuple[str, str]], resume_max: int, resumable: bool
) -> None:
    request = Upstream(method, target, tuple(headers), b"{}", None)
    resumer = Resumer.of(request, resume_max, 60.0, None)
    assert (resumer is not None) == resumable
