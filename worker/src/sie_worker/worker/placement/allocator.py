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
from operator import attrgetter
from typing import Literal, get_args

from sie_worker.config.widths import width_fits

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
    if not width_fits(width, devices.count):
        raise ValueError(f"width {width} does not fit {devices.count} device(s)")
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown placement strategy {strategy!r}")
    if width == 1:
        return _place_one(devices, need, strategy)
    return _place_group(devices, width)


class _Devices:
    """The claims by device, checked, with what each device's residents reserve."""

    def __init__(self, budgets: tuple[int | None, ...], claims: Sequence[Claim]) -> None:
        count = self.count = len(budgets)
        self.budgets = budgets
        self.claims = claims
        # Per device: the group holding it, its width-1 residents, the bytes those of known
        # need reserve and how many have none. Built in one pass over the claims: this runs
        # on every decision, so it keeps to local names.
        group: list[Claim | None] = [None] * count
        residents: list[list[Claim]] = [[] for _ in budgets]
        used, unknown = [0] * count, [0] * count
        for claim in claims:
            start, width = claim.start, claim.width
            if width == 1 and 0 <= start < count:
                if group[start] is not None:
                    raise ValueError(f"device {start} is claimed twice")
                residents[start].append(claim)
                if claim.memory is None:
                    unknown[start] += 1
                else:
                    used[start] += claim.memory
                continue
            if width < 1 or start < 0 or start + width > count:
                raise ValueError(f"claim of {claim.model} is outside {count} device(s)")
            for index in range(start, start + width):
                if group[index] is not None or residents[index]:
                    raise ValueError(f"device {index} is claimed twice")
                group[index] = claim
        for index, here in enumerate(residents):
            if len(here) > 1 and (budgets[index] is None or unknown[index]):
                raise ValueError(f"device {index} is claimed twice")
        self.group, self.residents, self.used, self.unknown = group, residents, used, unknown

    def fits(self, index: int, need: int | None) -> bool:
        """Whether a model needing ``need`` fits on the device beside its residents."""
        return _fits(
            self.budgets[index],
            need,
            len(self.residents[index]),
            self.unknown[index],
            self.used[index],
        )

    def left_after(self, index: int, need: int | None) -> float:
        """Budget left on the device once a model needing ``need`` is placed (pack's key)."""
        budget = self.budgets[index]
        if budget is None or need is None:
            return float("inf")
        return budget - self.used[index] - need


def _fits(budget: int | None, need: int | None, staying: int, unknown: int, used: int) -> bool:
    """Whether a model needing ``need`` fits on a device of ``budget`` beside ``staying``
    residents, ``unknown`` of them of unknown need and the others reserving ``used``: an
    empty device always fits; otherwise every figure must be known and add up."""
    if not staying:
        return True
    return budget is not None and need is not None and not unknown and used + need <= budget


def _place_one(devices: _Devices, need: int | None, strategy: Strategy) -> Placement:
    open_devices = [i for i in range(devices.count) if devices.group[i] is None]
    fitting = [i for i in open_devices if devices.fits(i, need)]
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
        # Evictions go least recently used first: the last one is the most recently used.
        key = (len(evict), evict[-1].last_used, index)
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
    residents = devices.residents[index]
    budget = devices.budgets[index]
    staying, unknown, used = len(residents), devices.unknown[index], devices.used[index]
    evicted: list[Claim] = []
    for claim in sorted(residents, key=_lru):  # sorted only here: most loads need no eviction
        if not claim.movable:
            continue
        evicted.append(claim)
        staying -= 1
        if claim.memory is None:
            unknown -= 1
        else:
            used -= claim.memory
        if _fits(budget, need, staying, unknown, used):
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


# Sort key: least recently used first; ties by name, so that no choice depends on input
# order. attrgetter, not a lambda: it runs in C, and sorting residents is a hot path.
_lru = attrgetter("last_used", "model")


def _span(claim: Claim, names: Sequence[str]) -> str:
    return ",".join(names[i] for i in range(claim.start, claim.stop))
