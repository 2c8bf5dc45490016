"""What ``sie-worker plan`` reads of a GGUF file: its architecture's ``block_count`` (the
repeating layers), from the key-value header alone (GGUF v2/v3, little-endian), without
reading the tensors. Stops at the first answer; None when the file is no GGUF or lacks it."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

__all__ = ["block_count"]

_MAGIC = b"GGUF"
# value type -> struct format of a scalar (8: string, 9: array are read apart)
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9


def block_count(path: str | Path) -> int | None:
    try:
        with open(path, "rb") as file:
            return _read(file)
    except (OSError, struct.error, UnicodeDecodeError, ValueError):
        return None


def _read(file: BinaryIO) -> int | None:
    if file.read(4) != _MAGIC:
        return None
    (version,) = struct.unpack("<I", file.read(4))
    if version < 2:
        return None
    _tensors, pairs = struct.unpack("<QQ", file.read(16))
    arch = None
    for _ in range(pairs):
        key = _string(file)
        (kind,) = struct.unpack("<I", file.read(4))
        value = _value(file, kind)
        if key == "general.architecture" and isinstance(value, str):
            arch = value
        elif arch is not None and key == f"{arch}.block_count" and isinstance(value, int):
            return value
    return None


def _string(file: BinaryIO) -> str:
    (length,) = struct.unpack("<Q", file.read(8))
    return file.read(length).decode("utf-8")


def _value(file: BinaryIO, kind: int) -> object:
    if kind == _STRING:
        return _string(file)
    if kind == _ARRAY:
        item_kind, count = struct.unpack("<IQ", file.read(12))
        if item_kind in _SCALARS:  # skipped whole: a tokenizer's scores, types
            file.seek(count * struct.calcsize(_SCALARS[item_kind]), 1)
        else:
            for _ in range(count):
                _value(file, item_kind)
        return None
    if kind not in _SCALARS:
        raise ValueError(f"unknown GGUF value type {kind}")
    fmt = _SCALARS[kind]
    return struct.unpack(fmt, file.read(struct.calcsize(fmt)))[0]
