"""The session scorer the gateway routes by (and the router may): rendezvous hashing
(highest random weight). A session key ranks the backends by ``hash(key, name)``, highest
first: a session sticks to its first backend while that one is usable, and only a share
``1/n`` of the sessions moves when a backend joins. Pure."""

from __future__ import annotations

import hashlib
from collections.abc import Collection

__all__ = ["rendezvous_order", "session_score"]


def session_score(key: str, name: str) -> int:
    """The weight of backend ``name`` for session ``key`` (higher first)."""
    digest = hashlib.blake2b(f"{key}\0{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rendezvous_order(key: str, names: Collection[str]) -> list[str]:
    """``names`` ordered by ``hash(key, name)``, highest first (ties: the name)."""
    return sorted(names, key=lambda name: (-session_score(key, name), name))
