"""The LoRA affinity scorer the router and the gateway both pick by: a request for a LoRA
adapter (``<model>:<adapter>``) prefers a backend that has that adapter loaded already,
where the backend's poll lists its adapters (an engine serving a base model with the
adapter among its own serves it without loading anything). Among backends otherwise alike
(the same tier, within the load bound) it comes before the load: the least outstanding
backend with the adapter, else the least outstanding one. Pure."""

from __future__ import annotations

from collections.abc import Collection

__all__ = ["adapter_miss"]


def adapter_miss(loaded: Collection[str], adapter: str | None) -> int:
    """0 when a backend with the adapters ``loaded`` serves ``adapter`` as it is (or the
    request names no adapter), else 1: a sort key, lower first."""
    return 0 if adapter is None or adapter in loaded else 1
