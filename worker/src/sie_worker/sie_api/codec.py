"""SIE's bodies on the wire: MessagePack or JSON requests by ``Content-Type``, answers by
``Accept`` (MessagePack when it names neither), numeric arrays as sie-sdk decodes them.

An array travels in MessagePack as the map msgpack-numpy writes and sie-sdk's decoder
requires: keys packed as bin (``b"nd"``, ``b"type"``, ``b"kind"``, ``b"shape"``,
``b"data"``), ``type`` a numpy dtype code as str (``"<f4"``), ``data`` the raw little-endian
bytes as bin; the body is packed with ``use_bin_type=True``. In JSON an array is a list of
numbers. Error bodies are never rendered here: they are JSON whatever the ``Accept``.
"""

from __future__ import annotations

import array
import json
import struct
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
from starlette.responses import Response

from sie_worker.errors import InvalidRequest

__all__ = ["JSON", "MSGPACK", "Array", "decode_body", "is_msgpack", "render", "wants_json"]

MSGPACK = "application/msgpack"
JSON = "application/json"
_MSGPACK_TYPES = (MSGPACK, "application/x-msgpack", "application/vnd.msgpack")
# numpy dtype code -> array/struct format of one element
_FORMATS = {"<f4": "f", "<f2": "e", "|i1": "b", "|u1": "B", "<i4": "i"}


@dataclass(frozen=True)
class Array:
    """A numeric array: numpy dtype code (``<f4``, ``<f2``, ``|i1``, ``|u1``), shape, bytes."""

    dtype: str
    shape: tuple[int, ...]
    data: bytes

    def tolist(self) -> list[Any]:
        fmt = _FORMATS[self.dtype]
        if fmt == "e":
            flat: list[Any] = list(struct.unpack(f"<{len(self.data) // 2}e", self.data))
        else:
            values = array.array(fmt, self.data)
            if sys.byteorder == "big" and values.itemsize > 1:  # pragma: no cover
                values.byteswap()
            flat = values.tolist()
        if len(self.shape) <= 1:
            return flat
        width = self.shape[-1]
        return [flat[i : i + width] for i in range(0, len(flat), width)]

    def packed(self) -> dict[bytes, Any]:
        return {
            b"nd": True,
            b"type": self.dtype,
            b"kind": b"",
            b"shape": list(self.shape),
            b"data": self.data,
        }


def is_msgpack(content_type: str | None) -> bool:
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return media in _MSGPACK_TYPES


def decode_body(body: bytes, content_type: str | None) -> Any:
    """The request body: MessagePack when ``Content-Type`` says so, else JSON."""
    if is_msgpack(content_type):
        try:
            return msgpack.unpackb(body, raw=False, strict_map_key=False)
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise InvalidRequest(
                f"the request body is not valid MessagePack (Content-Type: {content_type}): "
                f"{type(exc).__name__}"
            ) from None
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        raise InvalidRequest(
            "the request body is not valid JSON; send JSON, or MessagePack with "
            f"Content-Type: {MSGPACK}"
        ) from None


def wants_json(accept: str | None) -> bool:
    """Whether ``Accept`` prefers JSON to MessagePack (MessagePack when it names neither)."""
    if not accept:
        return False
    ranges = [_media_range(part) for part in accept.split(",") if part.strip()]
    return _quality(ranges, (JSON,)) > _quality(ranges, _MSGPACK_TYPES)


def render(payload: dict[str, Any], *, as_json: bool, headers: dict[str, str]) -> Response:
    """``payload`` (whose arrays are :class:`Array`) as MessagePack or JSON."""
    if as_json:
        content = json.dumps(payload, default=_json_default, separators=(",", ":")).encode()
        return Response(content, media_type=JSON, headers=headers)
    content = msgpack.packb(payload, use_bin_type=True, default=_msgpack_default)
    return Response(content, media_type=MSGPACK, headers=headers)


def _msgpack_default(value: object) -> Any:
    if isinstance(value, Array):
        return value.packed()
    raise TypeError(f"cannot pack {type(value).__name__}")


def _json_default(value: object) -> Any:
    if isinstance(value, Array):
        return value.tolist()
    raise TypeError(f"cannot render {type(value).__name__} as JSON")


def _media_range(part: str) -> tuple[str, float]:
    media, *params = (p.strip() for p in part.split(";"))
    q = 1.0
    for param in params:
        name, _, value = param.partition("=")
        if name.strip().lower() == "q":
            try:
                q = float(value)
            except ValueError:
                q = 0.0
    return media.lower(), q


def _quality(ranges: Sequence[tuple[str, float]], types: Sequence[str]) -> float:
    """The q of the most specific range matching any of ``types`` (0 when none does)."""
    best: tuple[int, float] = (-1, 0.0)
    for media, q in ranges:
        for wanted in types:
            kind = wanted.split("/", 1)[0]
            specificity = (
                2 if media == wanted else 1 if media == f"{kind}/*" else 0 if media == "*/*" else -1
            )
            if specificity > best[0]:
                best = (specificity, q)
    return best[1]
