"""The load bound the router and the gateway both route within (consistent hashing with
bounded loads, Mirrokni et al.; HAProxy's ``hash-balance-factor``): a backend may take one
more request while that keeps it within ``ceil(1.25 x (all in flight + 1) / backends)``.
Sessions (gateway) and cached prefixes (both) go to their backend only within it; the
least loaded backend is always within it."""

from __future__ import annotations

import math

__all__ = ["BALANCE_FACTOR", "load_cap", "within_bound"]

BALANCE_FACTOR = 1.25


def load_cap(total: int, candidates: int, factor: float = BALANCE_FACTOR) -> int:
    """The in-flight count a backend may reach when ``candidates`` of them hold ``total``
    (before this request)."""
    return max(1, math.ceil(factor * (total + 1) / candidates))


def within_bound(outstanding: int, cap: int, *, slots: int = 1, slot_target: int = 0) -> bool:
    """The load-bound filter: a backend with ``outstanding`` requests may take one more
    while below ``slot_target`` per serving slot (the gateway's pods), or while one more
    keeps it within ``cap`` (:func:`load_cap`)."""
    return outstanding < slots * slot_target or outstanding + 1 <= cap
