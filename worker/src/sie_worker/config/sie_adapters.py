"""Every adapter path SIE defines, and the SIE bundles that carry it.

Shipped as ``data/sie-adapters-<version>.json``, generated from the ``sie-server`` wheel by
``scripts/sie-adapters`` (a test fails when it is stale). A config may name any of these
paths: the ones this image runs resolve to their declaration in :mod:`sie_server.adapters`,
the others read fine and are refused when the model loads, naming SIE's bundle for them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import MappingProxyType

__all__ = ["SieAdapter", "sie_adapters", "sie_bundles", "sie_version"]

_DATA = Path(__file__).resolve().parent / "data"
_FILE = re.compile(r"^sie-adapters-(?P<version>[0-9][0-9A-Za-z.+-]*)\.json$")


@dataclass(frozen=True)
class SieAdapter:
    path: str
    bundles: tuple[str, ...]  # SIE's bundles carrying its module (empty: none of them)
    catalogue_profiles: int  # profiles of SIE's model catalogue that name it


@cache
def _load() -> tuple[str, Mapping[str, SieAdapter], Mapping[str, tuple[str, ...]]]:
    files = sorted(p for p in _DATA.iterdir() if _FILE.match(p.name)) if _DATA.is_dir() else []
    if not files:
        return "", MappingProxyType({}), MappingProxyType({})
    data = json.loads(files[-1].read_text(encoding="utf-8"))
    adapters = {
        path: SieAdapter(path, tuple(entry["bundles"]), int(entry["catalogue_profiles"]))
        for path, entry in data["adapters"].items()
    }
    bundles = {name: tuple(modules) for name, modules in data["bundles"].items()}
    return str(data["sie_server"]), MappingProxyType(adapters), MappingProxyType(bundles)


def sie_version() -> str:
    """The sie-server release the shipped list comes from (``0.10.1``)."""
    return _load()[0]


def sie_adapters() -> Mapping[str, SieAdapter]:
    """``{adapter path: SieAdapter}`` for every adapter SIE defines."""
    return _load()[1]


def sie_bundles() -> Mapping[str, tuple[str, ...]]:
    """``{SIE bundle: adapter modules it carries}``."""
    return _load()[2]
