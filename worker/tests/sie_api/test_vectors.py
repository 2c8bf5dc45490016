"""Vectors between the engines and SIE: an engine's embeddings answer read, float32 bytes,
SIE's output dtypes, cosine."""

from __future__ import annotations

import base64
import json
import math
import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sie_worker.sie_api.vectors import (
    convert,
    cosine,
    float32_bytes,
    floats,
    read_embeddings,
)

_FLOATS = st.lists(
    st.floats(min_value=-10, max_value=10, allow_nan=False, width=32), min_size=1, max_size=40
)


@given(_FLOATS)
def test_an_embedding_in_base64_or_as_numbers_gives_the_same_float32_bytes(
    values: list[float],
) -> None:
    data = struct.pack(f"<{len(values)}f", *values)
    assert float32_bytes(base64.b64encode(data).decode()) == data
    assert float32_bytes(values) == data
    assert floats(data) == pytest.approx(values)


def _answer(vectors: list[list[float]], **extra: Any) -> dict[str, Any]:
    data = [
        {"object": "embedding", "index": i, "embedding": base64.b64encode(_f32(v)).decode()}
        for i, v in enumerate(vectors)
    ]
    return {"object": "list", "data": data, "model": "m", **extra}


def _f32(values: list[float]) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def _same_but_vectors(read: Any, answer: dict[str, Any]) -> None:
    """``read`` is ``answer``, each base64 string as the bytes it decodes to."""
    got = [float32_bytes(entry["embedding"]) for entry in read["data"]]
    assert got == [float32_bytes(entry["embedding"]) for entry in answer["data"]]
    strip = [{k: v for k, v in e.items() if k != "embedding"} for e in read["data"]]
    assert strip == [{k: v for k, v in e.items() if k != "embedding"} for e in answer["data"]]
    assert {k: v for k, v in read.items() if k != "data"} == {
        k: v for k, v in answer.items() if k != "data"
    }


@given(st.lists(_FLOATS, min_size=1, max_size=5))
def test_an_embeddings_answer_reads_as_json_with_its_vectors_set_aside(
    vectors: list[list[float]],
) -> None:
    answer = _answer(vectors, usage={"prompt_tokens": 3, "total_tokens": 3})
    content = json.dumps(answer, separators=(",", ":")).encode()
    read = read_embeddings(content)
    _same_but_vectors(read, answer)
    assert all(isinstance(entry["embedding"], memoryview) for entry in read["data"])


@pytest.mark.parametrize(
    "content",
    [
        # Spaced JSON: json.loads reads it all.
        json.dumps(_answer([[1.0, 2.0]])).encode(),
        # An escaped slash in the base64, a quote before the key: json.loads again.
        b'{"data":[{"index":0,"embedding":"AACAPw\\/A"}],"model":"m"}',
        b'{"data":[{"index":0,"embedding":"AACAPw=="}],"a\\"embedding":"AAAA"}',
        # An embedding key outside the data: its string is left as it was.
        b'{"data":[{"index":0,"embedding":"AACAPw=="}],"meta":{"embedding":"AAAA"}}',
    ],
    ids=["spaced", "escaped-slash", "key-in-a-string", "key-elsewhere"],
)
def test_an_answer_the_cut_is_not_sure_of_reads_as_json_loads_reads_it(content: bytes) -> None:
    _same_but_vectors(read_embeddings(content), json.loads(content))


@pytest.mark.parametrize(
    "content", [b'{"data":[{"embedding":"AAAA"}', b'{"data":[{"embedding":"AAAA', b"", b"[}"]
)
def test_what_is_not_json_raises_json_loads_error(content: bytes) -> None:
    with pytest.raises(json.JSONDecodeError):
        read_embeddings(content)


@pytest.mark.parametrize("embedding", [None, "", "not base64!", "AAA=", [], ["x"], [True], {}])
def test_what_is_no_vector_gives_none(embedding: object) -> None:
    assert float32_bytes(embedding) is None


@given(_FLOATS)
def test_int8_is_symmetric_over_the_largest_magnitude(values: list[float]) -> None:
    data = struct.pack(f"<{len(values)}f", *values)
    array, word = convert(data, "int8")
    got = list(struct.unpack(f"<{len(values)}b", array.data))
    scale = max(abs(v) for v in floats(data))
    assert word == "int8"
    assert array.dtype == "|i1"
    assert got == (
        [0] * len(values) if scale == 0 else [round(v / scale * 127) for v in floats(data)]
    )


@given(_FLOATS)
def test_uint8_spans_the_vectors_range(values: list[float]) -> None:
    data = struct.pack(f"<{len(values)}f", *values)
    array, _ = convert(data, "uint8")
    got = list(array.data)
    exact = floats(data)
    low, high = min(exact), max(exact)
    if high == low:
        assert got == [128] * len(values)
    else:
        assert got == [round((v - low) / (high - low) * 255) for v in exact]


@given(_FLOATS)
def test_binary_packs_one_bit_per_positive_dimension_most_significant_first(
    values: list[float],
) -> None:
    data = struct.pack(f"<{len(values)}f", *values)
    array, word = convert(data, "binary")
    assert (word, array.dtype, array.shape) == ("binary", "|u1", ((len(values) + 7) // 8,))
    bits = "".join(f"{byte:08b}" for byte in array.data)[: len(values)]
    assert bits == "".join("1" if v > 0 else "0" for v in floats(data))
    assert convert(data, "ubinary")[0] == array


def test_float16_and_float32_keep_the_values() -> None:
    data = struct.pack("<3f", 0.5, -0.25, 1.0)
    half, word = convert(data, "float16")
    assert (word, half.dtype) == ("float16", "<f2")
    assert struct.unpack("<3e", half.data) == (0.5, -0.25, 1.0)
    assert convert(data, "float32") == (type(half)("<f4", (3,), data), "float32")
    with pytest.raises(ValueError, match="unknown output_dtype"):
        convert(data, "int4")


def test_cosine_is_one_for_parallel_and_zero_for_orthogonal_or_empty_vectors() -> None:
    assert math.isclose(cosine([1, 2], [2, 4]), 1.0)
    assert cosine([1, 0], [0, 3]) == 0.0
    assert cosine([0, 0], [1, 1]) == 0.0
