"""Block placement: which contiguous devices a model gets and whom it evicts. Pure, no I/O.

Rules:

- A width-N model claims a contiguous block of N devices, exclusively, while it stays loaded.
- An empty block is taken when one exists: the first one in device-list order.
- Otherwise unpinned models are evicted to free a block:
  1. blocks holding a pinned model are skipped (so are blocks holding a model that is
     still loading: it cannot be stopped half-started);
  2. the block needing the fewest evictions wins;
  3. on a tie, the block whose most recently used model has been idle longest wins;
  4. on a further tie, the first block in device-list order.
- No block can be freed: :class:`NoPlacement`, naming what holds the devices.

A single-device model on a full worker falls out of the same rules: every block needs one
eviction, so the least recently used unpinned model (a group or not) is evicted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Claim", "NoPlacement", "Placement", "place"]


@dataclass(frozen=True)
class Claim:
    """A model holding devices ``start .. start + width - 1``.

    ``last_used`` is any monotonic clock reading of the model's latest use; ``evictable`` is
    False while the model cannot be stopped (loading).
    """

    model: str
    start: int
    width: int
    pinned: bool = False
    last_used: float = 0.0
    evictable: bool = True

    @property
    def stop(self) -> int:
        return self.start + self.width


@dataclass(frozen=True)
class Placement:
    """Where a model goes: devices ``start .. start + width - 1``, after evicting ``evict``."""

    start: int
    width: int
    evict: tuple[str, ...] = ()

    @property
    def indices(self) -> range:
        return range(self.start, self.start + self.width)


class NoPlacement(Exception):
    """No block of the requested width can be freed right now."""

    def __init__(self, width: int, device_count: int, holders: Sequence[Claim]) -> None:
        self.width = width
        self.device_count = device_count
        self.holders = tuple(holders)
        super().__init__(self.describe([f"device {i}" for i in range(device_count)]))

    def describe(self, names: Sequence[str]) -> str:
        """The refusal, naming devices by ``names`` (e.g. ``cuda:0``) and what holds them."""
        held = ", ".join(
            f"{c.model} on {_span(c, names)} ({'pinned' if c.pinned else 'loading'})"
            for c in self.holders
            if c.pinned or not c.evictable
        )
        return (
            f"no block of {self.width} contiguous device(s) out of {self.device_count} can be "
            f"freed: every block holds a pinned or loading model ({held or 'none'}); "
            "retry after a model unloads, or unpin one"
        )


def place(device_count: int, claims: Sequence[Claim], width: int) -> Placement:
    """Choose the block for a width-``width`` model given the current claims.

    Raises ``ValueError`` for a width outside 1..device_count or overlapping claims, and
    :class:`NoPlacement` when every block holds a pinned or loading model.
    """
    if not 1 <= width <= device_count:
        raise ValueError(f"width {width} does not fit {device_count} device(s)")
    owner = _owners(device_count, claims)

    best: tuple[int, float, int] | None = None
    best_evict: tuple[str, ...] = ()
    for start in range(device_count - width + 1):
        holders = _unique(owner[start : start + width])
        if not holders:
            return Placement(start, width)
        if any(c.pinned or not c.evictable for c in holders):
            continue
        recency = max(c.last_used for c in holders)
        key = (len(holders), recency, start)
        if best is None or key < best:
            best = key
            # Least recently used first: the order evictions are carried out in.
            best_evict = tuple(c.model for c in sorted(holders, key=lambda c: c.last_used))
    if best is None:
        raise NoPlacement(width, device_count, _unique(owner))
    return Placement(best[2], width, best_evict)


def _owners(device_count: int, claims: Sequence[Claim]) -> list[Claim | None]:
    owner: list[Claim | None] = [None] * device_count
    for claim in claims:
        if claim.width < 1 or claim.start < 0 or claim.stop > device_count:
            raise ValueError(f"claim of {claim.model} is outside {device_count} device(s)")
        for index in range(claim.start, claim.stop):
            if owner[index] is not None:
                raise ValueError(f"device {index} is claimed twice")
            owner[index] = claim
    return owner


def _unique(window: Sequence[Claim | None]) -> list[Claim]:
    seen: list[Claim] = []
    for claim in window:
        if claim is not None and all(claim is not s for s in seen):
            seen.append(claim)
    return seen


def _span(claim: Claim, names: Sequence[str]) -> str:
    return ",".join(names[i] for i in range(claim.start, claim.stop))
