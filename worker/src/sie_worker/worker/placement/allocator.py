"""Placement: which devices a model gets and whom it evicts. Pure, no I/O.

A device has a memory *budget* (its total x the pressure threshold), or none when its memory
is unknown; a model has a *need* in bytes on each of its devices, or none when unknown.

Width 1 (a single-device model):

- It goes on a device that no group holds, where it fits beside the models already there:
  an empty device always fits; an occupied one fits when the budget, the need and every
  resident's need are known and the needs add up to at most the budget. (Unknown memory
  therefore keeps one model per device.)
- Among the devices it fits on, ``spread`` (the default, as SIE) takes the device with the
  fewest models, then the lowest index; ``pack`` the device with the least budget left after
  placing it, then the lowest index.
- Nothing fits: unpinned ready models are evicted from the one device, not held by a group,
  that needs the fewest evictions. On a device they go least recently used first until the
  model fits; a device whose pinned or loading models leave no room is skipped. A tie goes
  to the device whose most recently used model among those evicted has been idle longest,
  then to the lowest index.
- No such device (groups hold every device, or every other device's room is held by pinned
  or loading models): the least recently used unpinned ready group is evicted and the model
  takes its first device.

Width N >= 2 (a group) claims a contiguous block of N devices that hold no model, exclusively;
the first such block in device order. Otherwise the block needing the fewest evictions wins
(every model in it counts, width-1 residents too), then the block whose most recently used
model has been idle longest, then the first block; blocks holding a pinned or loading model
are skipped.

No way to make room: :class:`NoPlacement`, naming what holds the devices. Every choice is a
function of the set of claims, never of the order they are listed in (ties between models
go by name).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

__all__ = ["STRATEGIES", "Claim", "NoPlacement", "Placement", "Strategy", "place"]

Strategy = Literal["spread", "pack"]
STRATEGIES: tuple[Strategy, ...] = get_args(Strategy)


@dataclass(frozen=True)
class Claim:
    """A model holding devices ``start .. start + width - 1``.

    ``last_used`` is any monotonic clock reading of the model's latest use; ``evictable`` is
    False while the model cannot be stopped (loading). ``memory`` is what it reserves on each
    of its devices (bytes); None: unknown, so it shares its device with nobody.
    """

    model: str
    start: int
    width: int
    pinned: bool = False
    last_used: float = 0.0
    evictable: bool = True
    memory: int | None = None

    @property
    def stop(self) -> int:
        return self.start + self.width

    @property
    def movable(self) -> bool:
        """Whether placement may evict it."""
        return self.evictable and not self.pinned


@dataclass(frozen=True)
class Placement:
    """Where a model goes: devices ``start .. start + width - 1``, after evicting ``evict``
    (in that order: least recently used first)."""

    start: int
    width: int
    evict: tuple[str, ...] = ()

    @property
    def indices(self) -> range:
        return range(self.start, self.start + self.width)


class NoPlacement(Exception):
    """No device (width 1) or block (width N) can be made to hold the model right now."""

    def __init__(self, width: int, device_count: int, holders: Sequence[Claim]) -> None:
        self.width = width
        self.device_count = device_count
        self.holders = tuple(sorted(holders, key=lambda c: (c.start, c.model)))
        super().__init__(self.describe([f"device {i}" for i in range(device_count)]))

    def describe(self, names: Sequence[str]) -> str:
        """The refusal, naming devices by ``names`` (e.g. ``cuda:0``) and what holds them."""
        held = ", ".join(
            f"{c.model} on {_span(c, names)} ({'pinned' if c.pinned else 'loading'})"
            for c in self.holders
            if not c.movable
        )
        what = (
            "no device can make room for the model"
            if self.width == 1
            else f"no block of {self.width} contiguous device(s) can be freed"
        )
        return (
            f"{what} out of {self.device_count}: pinned or loading models hold the room it "
            f"needs ({held or 'none'}); retry after a model unloads, or unpin one"
        )


def place(
    budgets: int | Sequence[int | None],
    claims: Sequence[Claim],
    width: int,
    *,
    need: int | None = None,
    strategy: Strategy = "spread",
) -> Placement:
    """Choose the devices of a width-``width`` model needing ``need`` bytes on each.

    ``budgets`` is each device's budget in bytes (None: unknown), or a device count for
    devices of unknown memory. Raises ``ValueError`` for a width outside 1..device count or
    claims that break the invariants (outside the devices, a group sharing a device, two
    models on a device of unknown memory), and :class:`NoPlacement` when no room can be made.
    """
    devices = _Devices((None,) * budgets if isinstance(budgets, int) else tuple(budgets), claims)
    if not 1 <= width <= devices.count:
        raise ValueError(f"width {width} does not fit {devices.count} device(s)")
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown placement strategy {strategy!r}")
    if width == 1:
        return _place_one(devices, need, strategy)
    return _place_group(devices, width)


class _Devices:
    """The claims by device, checked."""

    def __init__(self, budgets: tuple[int | None, ...], claims: Sequence[Claim]) -> None:
        self.count = len(budgets)
        self.budgets = budgets
        self.group: list[Claim | None] = [None] * self.count
        self.residents: list[list[Claim]] = [[] for _ in budgets]
        self.claims = list(claims)
        for claim in claims:
            if claim.width < 1 or claim.start < 0 or claim.stop > self.count:
                raise ValueError(f"claim of {claim.model} is outside {self.count} device(s)")
            for index in range(claim.start, claim.stop):
                if self.group[index] is not None or (claim.width > 1 and self.residents[index]):
                    raise ValueError(f"device {index} is claimed twice")
                if claim.width > 1:
                    self.group[index] = claim
                else:
                    self.residents[index].append(claim)
        for index, residents in enumerate(self.residents):
            residents.sort(key=_lru)
            if len(residents) > 1 and not self._shares(index):
                raise ValueError(f"device {index} is claimed twice")

    def _shares(self, index: int) -> bool:
        """Whether the device's residents have known needs on a device of known budget."""
        return self.budgets[index] is not None and all(
            r.memory is not None for r in self.residents[index]
        )

    def fits(self, index: int, need: int | None, residents: Sequence[Claim]) -> bool:
        """Whether a model needing ``need`` fits on the device beside ``residents``."""
        if not residents:
            return True
        budget = self.budgets[index]
        if budget is None or need is None or any(r.memory is None for r in residents):
            return False
        return sum(r.memory or 0 for r in residents) + need <= budget

    def left_after(self, index: int, need: int | None) -> float:
        """Budget left on the device once a model needing ``need`` is placed (pack's key)."""
        budget = self.budgets[index]
        if budget is None or need is None:
            return float("inf")
        return budget - sum(r.memory or 0 for r in self.residents[index]) - need


def _place_one(devices: _Devices, need: int | None, strategy: Strategy) -> Placement:
    open_devices = [i for i in range(devices.count) if devices.group[i] is None]
    fitting = [i for i in open_devices if devices.fits(i, need, devices.residents[i])]
    if fitting:
        if strategy == "pack":
            return Placement(min(fitting, key=lambda i: (devices.left_after(i, need), i)), 1)
        return Placement(min(fitting, key=lambda i: (len(devices.residents[i]), i)), 1)
    best: tuple[int, float, int] | None = None
    best_evict: tuple[str, ...] = ()
    for index in open_devices:
        evict = _evictions(devices, index, need)
        if evict is None:
            continue
        key = (len(evict), max(c.last_used for c in evict), index)
        if best is None or key < best:
            best, best_evict = key, tuple(c.model for c in evict)
    if best is not None:
        return Placement(best[2], 1, best_evict)
    groups = {c.model: c for c in devices.group if c is not None and c.movable}
    if groups:
        oldest = min(groups.values(), key=_lru)
        return Placement(oldest.start, 1, (oldest.model,))
    raise NoPlacement(1, devices.count, devices.claims)


def _evictions(devices: _Devices, index: int, need: int | None) -> list[Claim] | None:
    """Least recently used first, the movable residents to evict until the model fits;
    None when the device's pinned or loading models leave it no room."""
    staying = list(devices.residents[index])
    evicted: list[Claim] = []
    for claim in devices.residents[index]:  # least recently used first
        if not claim.movable:
            continue
        staying.remove(claim)
        evicted.append(claim)
        if devices.fits(index, need, staying):
            return evicted
    return None


def _place_group(devices: _Devices, width: int) -> Placement:
    best: tuple[int, float, int] | None = None
    best_holders: list[Claim] = []
    for start in range(devices.count - width + 1):
        holders: dict[str, Claim] = {}
        for index in range(start, start + width):
            group = devices.group[index]
            for claim in [group] if group is not None else devices.residents[index]:
                holders[claim.model] = claim
        if not holders:
            return Placement(start, width)
        if not all(c.movable for c in holders.values()):
            continue
        key = (len(holders), max(c.last_used for c in holders.values()), start)
        if best is None or key < best:
            best, best_holders = key, sorted(holders.values(), key=_lru)
    if best is None:
        raise NoPlacement(width, devices.count, devices.claims)
    return Placement(best[2], width, tuple(c.model for c in best_holders))


def _lru(claim: Claim) -> tuple[float, str]:
    """Least recently used first; ties by name, so that no choice depends on input order."""
    return (claim.last_used, claim.model)


def _span(claim: Claim, names: Sequence[str]) -> str:
    return ",".join(names[i] for i in range(claim.start, claim.stop))
