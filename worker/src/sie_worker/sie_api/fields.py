"""Reading SIE request bodies: each helper returns the value or raises
:class:`~sie_worker.errors.InvalidRequest` naming the field (``param``) and what it takes."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from sie_worker.errors import InvalidRequest

__all__ = [
    "bad",
    "object_at",
    "optional_bool",
    "optional_int",
    "optional_number",
    "optional_object",
    "optional_str",
    "refuse_unknown",
]


def bad(field: str, message: str) -> InvalidRequest:
    return InvalidRequest(f"{field}: {message}", param=field)


def object_at(value: object, field: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise bad(field, "must be an object (a map with string keys)")
    return value


def optional_object(data: Mapping[str, Any], key: str, field: str) -> Mapping[str, Any]:
    value = data.get(key)
    return {} if value is None else object_at(value, field)


def optional_str(data: Mapping[str, Any], key: str, field: str) -> str | None:
    value = data.get(key)
    if value is None or isinstance(value, str):
        return value
    raise bad(field, f"must be a string, got {type(value).__name__}")


def optional_bool(data: Mapping[str, Any], key: str, field: str) -> bool | None:
    value = data.get(key)
    if value is None or isinstance(value, bool):
        return value
    raise bad(field, "must be true or false")


def optional_int(
    data: Mapping[str, Any], key: str, field: str, *, minimum: int | None = None
) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(field, "must be an integer")
    if minimum is not None and value < minimum:
        raise bad(field, f"must be at least {minimum}, got {value}")
    return value


def optional_number(data: Mapping[str, Any], key: str, field: str) -> float | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise bad(field, "must be a finite number")
    return float(value)


def refuse_unknown(data: Mapping[str, Any], known: frozenset[str], where: str) -> None:
    """Refuse the first key (sorted) of ``data`` that is not in ``known``."""
    unknown = sorted(set(data) - known)
    if unknown:
        field = f"{where}.{unknown[0]}" if where else unknown[0]
        raise bad(field, "is not a field of this request; fields: " + ", ".join(sorted(known)))
