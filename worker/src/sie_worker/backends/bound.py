"""The load bound the router and the gateway both route within (consistent hashing with
bounded loads, Mirrokni et al.; HAProxy's ``hash-balance-factor``): a backend may take one
more request while that keeps it within ``ceil(1.25 x (all in flight + 1) / backends)``.
Sessions (gateway) and cached prefixes (both) go to their backend only within it; the
least loaded backend is always within it."""

from __future__ import annotations

import math

__all__ = ["BALANCE_FACTOR", "load_cap"]

BALANCE_FACTOR = 1.25


def load_cap(total: int, candidates: int, factor: float = BALANCE_FACTOR) -> int:
    """The in-flight count a backend may reach when ``candidates`` of them hold ``total``
    (before this request)."""
    return max(1, math.ceil(factor * (total + 1) / candidates))
