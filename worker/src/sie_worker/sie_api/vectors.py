"""Dense vectors between the engines and SIE: float32 bytes from an OpenAI embedding, the
``output_dtype`` conversions SIE defines, cosine similarity. Pure; no numpy.

:func:`read_embeddings` reads an engine's embeddings answer without passing its base64
vectors through the JSON decoder: a third of an SIE encode's worker CPU at 16 x 3,584
dimensions went to ``json.loads`` scanning 300 kB of base64 it then handed over as str
(``docs/benchmarks.md``, "One hop, parsed once").

``output_dtype`` as sie-server computes it: ``float32``; ``float16``; ``int8`` symmetric
(``round(x / max|x| * 127)``, zeros stay zeros); ``uint8`` linear over the vector's range
(``round((x - min) / (max - min) * 255)``, a constant vector is all 128); ``binary`` and
``ubinary`` one bit per dimension (``x > 0``), packed most significant bit first.
"""

from __future__ import annotations

import array
import binascii
import json
import math
import struct
import sys
from collections.abc import Sequence
from typing import Any

from sie_worker.sie_api.codec import Array

__all__ = ["OUTPUT_DTYPES", "convert", "cosine", "float32_bytes", "floats", "read_embeddings"]

OUTPUT_DTYPES = ("float32", "float16", "int8", "uint8", "binary", "ubinary")
# How every engine family writes a base64 vector's key (compact JSON: SGLang's orjson,
# vLLM's pydantic, the default engine's); other spellings take json.loads' way.
_EMBEDDING = b'"embedding":"'
# Marks a vector set aside in the text json.loads reads (and its number follows); no
# base64 string holds it.
_HELD = "\x00held:"


def read_embeddings(content: bytes | bytearray) -> Any:
    """``content`` (an OpenAI embeddings answer) as ``json.loads`` reads it, except that
    each base64 ``"embedding"`` string is a memoryview of its bytes in ``content``: the
    strings are cut out by their quotes (base64 holds neither a quote nor a backslash) and
    the rest is decoded as JSON. Raises ValueError where ``json.loads`` would."""
    view = memoryview(content)
    parts: list[bytes | memoryview] = []
    held: list[memoryview] = []
    at = 0
    while (found := content.find(_EMBEDDING, at)) >= 0:
        start = found + len(_EMBEDDING)
        end = content.find(b'"', start)
        if end < 0 or content[found - 1 : found] == b"\\" or content.find(b"\\", start, end) >= 0:
            return json.loads(content)  # an escape near or in it: no cut is sure to be right
        parts += (view[at:start], b"\\u0000held:%d" % len(held))
        held.append(view[start:end])
        at = end
    if not held:
        return json.loads(content)
    parts.append(view[at:])
    answer = json.loads(b"".join(parts))
    data = answer.get("data") if isinstance(answer, dict) else None
    for entry in data if isinstance(data, list) else ():
        vector = entry.get("embedding") if isinstance(entry, dict) else None
        if isinstance(vector, str) and (number := _held_number(vector, held)) is not None:
            entry["embedding"] = held[number]
    return _restored(answer, held)


def _restored(node: Any, held: list[memoryview]) -> Any:
    """``node`` with any string still set aside (an ``embedding`` outside ``data``) as
    json.loads would have read it."""
    if isinstance(node, str):
        number = _held_number(node, held)
        return node if number is None else held[number].tobytes().decode()
    if isinstance(node, dict):
        for key, value in node.items():
            if isinstance(value, dict | list | str):
                node[key] = _restored(value, held)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            if isinstance(value, dict | list | str):
                node[i] = _restored(value, held)
    return node


def _held_number(text: str, held: list[memoryview]) -> int | None:
    if not text.startswith(_HELD):
        return None
    digits = text[len(_HELD) :]
    return int(digits) if digits.isdigit() and int(digits) < len(held) else None


def float32_bytes(embedding: object) -> bytes | None:
    """Little-endian float32 bytes of an OpenAI ``embedding`` (base64, as str or bytes, or a
    list of numbers); None when it is neither."""
    if isinstance(embedding, str | bytes | memoryview):
        try:
            # strict_mode checks the alphabet in C; b64decode(validate=True) runs a regular
            # expression over the text first, a quarter of an SIE encode's worker CPU.
            data = binascii.a2b_base64(embedding, strict_mode=True)
        except (binascii.Error, ValueError):
            return None
        return data if len(data) % 4 == 0 and data else None
    if isinstance(embedding, list) and embedding:
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in embedding):
            return None
        values = array.array("f", embedding)
        if sys.byteorder == "big":  # pragma: no cover - the wire format is little-endian
            values.byteswap()
        return values.tobytes()
    return None


def floats(data: bytes) -> list[float]:
    values = array.array("f", data)
    if sys.byteorder == "big":  # pragma: no cover
        values.byteswap()
    return values.tolist()


def convert(data: bytes, output_dtype: str) -> tuple[Array, str]:
    """The vector of float32 ``data`` as SIE's ``output_dtype``, and the ``dtype`` word."""
    dims = len(data) // 4
    if output_dtype == "float32":
        return Array("<f4", (dims,), data), "float32"
    values = floats(data)
    if output_dtype == "float16":
        return Array("<f2", (dims,), struct.pack(f"<{dims}e", *values)), "float16"
    if output_dtype == "int8":
        scale = max((abs(v) for v in values), default=0.0)
        ints = [0] * dims if scale == 0 else [_round(v / scale * 127) for v in values]
        return Array("|i1", (dims,), array.array("b", ints).tobytes()), "int8"
    if output_dtype == "uint8":
        low, high = min(values), max(values)
        span = high - low
        ints = [128] * dims if span == 0 else [_round((v - low) / span * 255) for v in values]
        return Array("|u1", (dims,), bytes(ints)), "uint8"
    if output_dtype in ("binary", "ubinary"):
        packed = bytearray((dims + 7) // 8)
        for i, v in enumerate(values):
            if v > 0:
                packed[i // 8] |= 0x80 >> (i % 8)
        return Array("|u1", (len(packed),), bytes(packed)), "binary"
    raise ValueError(f"unknown output_dtype {output_dtype!r}")


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = math.fsum(x * y for x, y in zip(a, b, strict=True))
    norm = math.sqrt(math.fsum(x * x for x in a)) * math.sqrt(math.fsum(y * y for y in b))
    return dot / norm if norm > 0 else 0.0


def _round(value: float) -> int:
    # numpy's round: half to even, as sie-server's quantisers round
    return round(value)
