"""The one reader of an OpenAI request body: a JSON object naming its model, else one 400."""

from __future__ import annotations

import json

import pytest

from sie_worker.errors import InvalidRequest
from sie_worker.http.request import BODY_NEEDS_MODEL, json_object, read_payload


@pytest.mark.parametrize(
    "body",
    [b"{", b"[" * 100_000, b"{" * 100_000, b"[1]", b"{}", b'{"model": ""}', b'{"model": 3}'],
)
def test_a_body_without_a_model_gets_the_one_invalid_request(body: bytes) -> None:
    with pytest.raises(InvalidRequest) as info:
        read_payload(body)
    assert (info.value.message, info.value.param) == (BODY_NEEDS_MODEL, "model")


def test_payload_is_the_json_object() -> None:
    assert read_payload(json.dumps({"model": "org/m", "n": 1}).encode()) == {
        "model": "org/m",
        "n": 1,
    }


def test_a_body_that_is_no_json_object_has_none() -> None:
    assert json_object(b"msgpack\x81") is None
    assert json_object(b' {"a": 1}') == {"a": 1}
