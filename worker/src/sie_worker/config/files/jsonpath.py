"""JSON paths for problems: ``$.profiles.default.extra_launch_args[0]``."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

__all__ = ["json_path"]

_PLAIN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]*$")


def json_path(parts: Iterable[str | int]) -> str:
    """Dot notation for plain keys (hyphens kept readable), brackets for indexes and the rest."""
    out = "$"
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _PLAIN.match(part):
            out += f".{part}"
        else:
            out += f"[{json.dumps(part, ensure_ascii=False)}]"
    return out
