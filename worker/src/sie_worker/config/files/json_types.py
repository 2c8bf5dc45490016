"""JSON's names for a value's type, as error messages write them."""

from __future__ import annotations

__all__ = ["type_name"]


def type_name(value: object) -> str:
    """JSON's name for a value's type: null, boolean, integer, number, string, array, object."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__
