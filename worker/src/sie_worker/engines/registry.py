"""The engine families this image runs, one per engine kind: the one list of them.

Each family is one package of :mod:`sie_worker.engines` (its object in ``family.py``), behind
the protocol of :class:`~sie_worker.engines.family.EngineFamily`. Adding an engine is adding
its package and one line here.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from sie_server.adapters.base import EngineKind
from sie_worker.engines.default.family import DEFAULT
from sie_worker.engines.family import EngineFamily, LoadSeries
from sie_worker.engines.llamacpp.family import LLAMACPP
from sie_worker.engines.sglang.family import SGLANG, SGLANG_CPU_ENV
from sie_worker.engines.vllm.family import VLLM

__all__ = [
    "BUNDLE_ENGINES",
    "FAMILIES",
    "IMAGE_BUNDLES",
    "PRODUCT_FAMILY",
    "SGLANG_CPU_ENV",
    "EngineFamily",
    "LoadSeries",
    "bundle_engine",
    "family_of",
    "owned_variables",
]

FAMILIES: Mapping[EngineKind, EngineFamily] = MappingProxyType(
    {family.kind: family for family in (SGLANG, VLLM, DEFAULT, LLAMACPP)}
)
# The engine each bundle of this image runs; a bundle of another name (a custom image) is
# taken for an SGLang one, as before vLLM was served.
BUNDLE_ENGINES: Mapping[str, EngineKind] = MappingProxyType(
    {bundle: family.kind for family in FAMILIES.values() for bundle in family.bundles}
)
IMAGE_BUNDLES: tuple[str, ...] = ("default", *sorted(b for b in BUNDLE_ENGINES if b != "default"))
# The family of a bundle this image does not name (a custom image), and the one a model
# whose adapter is unknown is sized as: SGLang, the product's engine.
PRODUCT_FAMILY = SGLANG


def family_of(kind: EngineKind) -> EngineFamily:
    """The family of an engine kind (an adapter's ``engine``); KeyError names the known ones."""
    try:
        return FAMILIES[kind]
    except KeyError:
        raise KeyError(
            f"no engine family {kind!r}; this image runs {', '.join(FAMILIES)}"
        ) from None


def bundle_engine(bundle: str) -> EngineKind:
    """The engine the bundle's image runs (``default``: the transformers engine)."""
    return BUNDLE_ENGINES.get(bundle, PRODUCT_FAMILY.kind)


def owned_variables() -> tuple[str, ...]:
    """The variables some engine's launcher writes on cpu devices (a profile's extra_env may
    not set them)."""
    return tuple(v for family in FAMILIES.values() for v in family.owned_variables)
