"""What a hop keeps of a relayed stream: whole events, error events held back, the text
the client has (also once folded past COMPACT_AT)."""

from __future__ import annotations

import json
from typing import Any

from sie_worker.http.stream_memory import COMPACT_AT, DONE_EVENT, StreamMemory, is_error_event


def _event(document: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(document).encode() + b"\n\n"


def _text(text: str, **extra: Any) -> bytes:
    choice = {"index": 0, "text": text, "finish_reason": None} | extra
    return _event({"id": "cmpl-1", "created": 7, "model": "m", "choices": [choice]})


def _delta(delta: dict[str, Any]) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": None}
    return _event({"id": "chat-1", "created": 7, "model": "m", "choices": [choice]})


def test_an_event_split_across_reads_leaves_once_whole() -> None:
    memory = StreamMemory("completions")
    event = _text(" a")
    assert memory.feed(event[:10]) == b""
    assert memory.feed(event[10:] + _text(" b")[:5]) == event
    assert memory.feed(_text(" b")[5:]) == _text(" b")
    assert memory.text == " a b"
    assert memory.sent_tokens == 2


def test_an_error_event_is_held_back_and_ends_the_reading() -> None:
    stopped = []
    memory = StreamMemory("completions")
    memory.stop = lambda: stopped.append(True)
    error = _event({"error": {"code": "engine_unavailable", "message": "gone"}})
    assert memory.feed(_text(" a") + error + _text(" late")) == _text(" a")
    assert memory.error == {"code": "engine_unavailable", "message": "gone"}
    assert memory.withheld == error + _text(" late")
    assert stopped == [True]
    assert memory.feed(_text(" more")) == b""


def test_text_that_mentions_an_error_is_not_an_error_event() -> None:
    memory = StreamMemory("completions")
    event = _text(' "error"')
    assert memory.feed(event) == event
    assert memory.error is None


def test_done_is_noted() -> None:
    memory = StreamMemory("completions")
    memory.feed(_text(" a"))
    assert not memory.done
    memory.feed(DONE_EVENT)
    assert memory.done


def test_a_long_stream_is_kept_compressed_and_read_back_as_the_same_text_and_counts() -> None:
    memory = StreamMemory("chat")
    memory.feed(_delta({"role": "assistant", "content": ""}))
    count = COMPACT_AT // len(_delta({"content": " w"})) + 10
    for _ in range(count):
        memory.feed(_delta({"content": " w"}))
    assert memory.text == " w" * count
    assert memory.sent_tokens == count
    assert memory.role_sent
    assert memory.identity == {"id": "chat-1", "created": 7, "model": "m"}


def test_usage_counts_win_over_counted_events() -> None:
    memory = StreamMemory("completions")
    memory.feed(_text(" a b c"))
    assert memory.sent_tokens == 1
    usage = {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}
    memory.feed(_event({"id": "cmpl-1", "choices": [], "usage": usage}))
    assert memory.sent_tokens == 3
    assert memory.usage_seen


def test_tool_calls_or_several_choices_make_a_stream_unresumable() -> None:
    memory = StreamMemory("chat")
    memory.feed(_delta({"tool_calls": [{"index": 0, "function": {"name": "f"}}]}))
    memory.summarize()
    assert memory.unresumable is not None
    other = StreamMemory("completions")
    other.feed(_event({"id": "x", "choices": [{"index": 1, "text": "b"}]}))
    other.summarize()
    assert other.unresumable == "several choices (n > 1)"


def test_error_events_of_either_shape_are_recognised() -> None:
    assert is_error_event(b'{"error": {"code": "x"}}') == {"code": "x"}
    assert is_error_event(b'{"object": "error", "message": "m"}') == {
        "object": "error",
        "message": "m",
    }
    assert is_error_event(b'{"choices": [], "error": {"code": "x"}}') is None
    assert is_error_event(b"[DONE]") is None


def test_an_engines_error_event_followed_by_done_is_held_back_with_it() -> None:
    memory = StreamMemory("completions")
    error = _event({"error": {"code": 500, "message": "engine dead"}})
    assert memory.feed(_text(" a") + _text(" b") + error + DONE_EVENT) == _text(" a") + _text(" b")
    assert memory.withheld == error + DONE_EVENT
    assert not memory.done


def test_what_is_kept_is_read_again_after_more_events() -> None:
    memory = StreamMemory("completions")
    for _ in range(COMPACT_AT // len(_text(" w")) + 1):
        memory.feed(_text(" w"))
    before = memory.sent_tokens
    memory.feed(_text(" x") + _text(" y"))
    assert memory.sent_tokens == before + 2
    assert memory.text.endswith(" w x y")
