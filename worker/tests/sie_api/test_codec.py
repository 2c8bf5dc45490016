"""SIE's wire format: bodies by Content-Type, answers by Accept, arrays as sie-sdk decodes."""

from __future__ import annotations

import contextlib
import json
import struct

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sie_worker.errors import InvalidRequest
from sie_worker.sie_api.codec import Array, decode_body, is_msgpack, render, wants_json


def test_an_array_packs_byte_for_byte_as_msgpack_numpy_writes_it() -> None:
    # np.arange(4, dtype="<f4") as msgpack-numpy packs it (what sie-sdk's decoder requires):
    # bin keys, the dtype code as str, an empty bin kind, the data as bin
    expected = bytes.fromhex(
        "85c4026e64c3c40474797065a33c6634c4046b696e64c400c40573686170659104"
        "c40464617461c41000000000" "0000803f" "00000040" "00004040"
    )  # fmt: skip
    array = Array("<f4", (4,), struct.pack("<4f", 0, 1, 2, 3))
    assert msgpack.packb(array.packed(), use_bin_type=True) == expected


def test_a_msgpack_answer_holds_arrays_as_maps_and_a_json_answer_as_lists() -> None:
    payload = {
        "model": "m",
        "items": [{"dense": {"values": Array("<f4", (2,), struct.pack("<2f", 1.5, -2))}}],
    }
    packed = render(payload, as_json=False, headers={})
    assert packed.media_type == "application/msgpack"
    values = msgpack.unpackb(packed.body, raw=False)["items"][0]["dense"]["values"]
    assert values[b"type"] == "<f4"
    assert values[b"shape"] == [2]
    assert struct.unpack("<2f", values[b"data"]) == (1.5, -2.0)
    as_json = render(payload, as_json=True, headers={"x-a": "1"})
    assert as_json.media_type == "application/json"
    assert as_json.headers["x-a"] == "1"
    assert json.loads(as_json.body)["items"][0]["dense"]["values"] == [1.5, -2.0]


@pytest.mark.parametrize(
    ("dtype", "data", "expected"),
    [
        ("<f2", struct.pack("<2e", 0.5, -1.0), [0.5, -1.0]),
        ("|i1", struct.pack("<2b", -127, 5), [-127, 5]),
        ("|u1", bytes([0, 255]), [0, 255]),
    ],
)
def test_arrays_of_every_output_dtype_render_as_json_numbers(
    dtype: str, data: bytes, expected: list[float]
) -> None:
    assert Array(dtype, (2,), data).tolist() == expected


def test_a_body_is_read_as_msgpack_only_when_the_content_type_says_so() -> None:
    body = {"items": [{"text": "x"}], "blob": b"\x00\x01"}
    packed = msgpack.packb(body, use_bin_type=True)
    assert decode_body(packed, "application/msgpack") == body
    assert decode_body(packed, "application/x-msgpack; charset=binary") == body
    assert decode_body(b'{"a": 1}', "application/json") == {"a": 1}
    assert decode_body(b'{"a": 1}', None) == {"a": 1}
    assert is_msgpack("Application/MsgPack")
    assert not is_msgpack("application/json")


@pytest.mark.parametrize(
    ("body", "content_type", "words"),
    [
        (b"\xc1", "application/msgpack", "not valid MessagePack"),
        (b"\x92\x01", "application/msgpack", "not valid MessagePack"),  # truncated array
        (b"\x81\x91\x01\x02", "application/msgpack", "not valid MessagePack"),  # list as key
        (b"{", "application/json", "not valid JSON"),
        (b"\x81\xa1a\x01", "application/json", "not valid JSON"),  # msgpack sent as JSON
    ],
)
def test_a_body_that_does_not_decode_is_refused_as_invalid_request(
    body: bytes, content_type: str, words: str
) -> None:
    with pytest.raises(InvalidRequest, match=words):
        decode_body(body, content_type)


@given(st.binary(max_size=64))
def test_no_msgpack_body_raises_anything_but_invalid_request(body: bytes) -> None:
    with contextlib.suppress(InvalidRequest):
        decode_body(body, "application/msgpack")


@pytest.mark.parametrize(
    ("accept", "json_answer"),
    [
        (None, False),
        ("", False),
        ("*/*", False),
        ("application/msgpack", False),
        ("application/json", True),
        ("application/json, */*;q=0.5", True),
        ("application/json;q=0.5, application/msgpack", False),
        ("application/json, application/msgpack", False),
        ("application/*", False),
        ("text/html", False),
        ("application/msgpack;q=0, application/json;q=0.1", True),
    ],
)
def test_the_answer_is_msgpack_unless_accept_prefers_json(
    accept: str | None, json_answer: bool
) -> None:
    assert wants_json(accept) is json_answer
