"""What ``sie-worker plan`` and ``size`` read of a GGUF file (GGUF v2/v3, little-endian),
from its header alone, never its tensors' data: the architecture's ``block_count`` (the
repeating layers; :func:`block_count` stops there), and for ``size`` every scalar of the
key-value header with the parameter count of the tensor infos (:func:`read_header`).
None when the file is no GGUF."""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

__all__ = ["GgufHeader", "block_count", "read_header"]

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


@dataclass(frozen=True)
class GgufHeader:
    """The scalars and strings of a GGUF file's key-value header (arrays left out), and the
    parameters its tensors hold."""

    metadata: dict[str, object]
    params: int

    def arch_value(self, key: str) -> object:
        """``<architecture>.<key>`` (``block_count``, ``attention.head_count``, ...)."""
        return self.metadata.get(f"{self.metadata.get('general.architecture')}.{key}")


def read_header(path: str | Path) -> GgufHeader | None:
    try:
        with open(path, "rb") as file:
            if file.read(4) != _MAGIC or struct.unpack("<I", file.read(4))[0] < 2:
                return None
            tensors, pairs = struct.unpack("<QQ", file.read(16))
            metadata = {}
            for _ in range(pairs):
                key = _string(file)
                (kind,) = struct.unpack("<I", file.read(4))
                value = _value(file, kind)
                if value is not None:
                    metadata[key] = value
            params = 0
            for _ in range(tensors):
                _string(file)  # its name
                (dims,) = struct.unpack("<I", file.read(4))
                shape = struct.unpack(f"<{dims}Q", file.read(8 * dims))
                file.read(12)  # its type (uint32) and data offset (uint64)
                params += math.prod(shape)
    except (OSError, struct.error, UnicodeDecodeError, ValueError):
        return None
    return GgufHeader(metadata, params)


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
