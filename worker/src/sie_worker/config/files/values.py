"""How a config value is shown in a problem message: its JSON type, then the value as the
config would spell it (``got a string '600'; write it without quotes``)."""

from __future__ import annotations

from sie_worker.config.files.json_types import type_name

__all__ = ["described", "number_text", "shown"]


def shown(value: object) -> str:
    """The value as a config would spell it, for messages (``type_name`` says null)."""
    if value is None or isinstance(value, dict | list):
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    text = repr(value)
    if isinstance(value, int) and len(text) > 20:
        return "(a very large number)"
    if isinstance(value, str):
        hint = "; write it without quotes" if _numeric(value) else ""
        return (text if len(text) <= 60 else text[:57] + "...") + hint
    return text if len(text) <= 60 else text[:57] + "..."


def described(value: object) -> str:
    """``a string '600'``, ``an integer 80``, ``null``: the type, then the value."""
    return f"{type_name(value)} {shown(value)}".rstrip()


def number_text(value: float) -> str:
    """``600`` for 600.0, ``0.5`` for 0.5."""
    return str(int(value)) if float(value).is_integer() else str(value)


def _numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
