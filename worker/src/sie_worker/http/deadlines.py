"""The deadlines of one relayed request, as data the relay consults.

Three limits, each named by the option that set it (for the error message): the read
timeout between chunks (``read_s``), the time to the first chunk (the answer's head, or a
stream's first body bytes; ``first_chunk``) and the whole answer (``overall``). They are
fixed when the request starts (:attr:`started`, loop time). Every answer a hop reads,
streamed or whole, is read by :class:`~sie_worker.http.upstream_answer.UpstreamAnswer`,
which keeps one timer armed at the nearest of them (:meth:`due`, :meth:`passed`): the one
deadline mechanism of the data path. Past one, :class:`DeadlineHit` names it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import httpx

__all__ = ["DeadlineHit", "Deadlines", "Limit"]


@dataclass(frozen=True)
class Limit:
    name: str  # the option: ``first_chunk_timeout_s``, ``request_read_timeout_s``...
    seconds: float


class DeadlineHit(Exception):
    """A deadline passed: ``name`` is the option, ``seconds`` its value."""

    def __init__(self, name: str, seconds: float) -> None:
        super().__init__(name)
        self.name, self.seconds = name, seconds


class Deadlines:
    """One request's limits, from now: ``read`` between chunks, ``first_chunk`` until the
    first chunk has come, ``overall`` for the whole answer (each None: no such limit)."""

    __slots__ = ("first_chunk", "overall", "read", "started")

    def __init__(
        self,
        read: Limit | None = None,
        *,
        first_chunk: Limit | None = None,
        overall: Limit | None = None,
    ) -> None:
        self.read, self.first_chunk, self.overall = read, first_chunk, overall
        self.started = asyncio.get_running_loop().time()

    @property
    def read_s(self) -> float | None:
        return self.read.seconds if self.read is not None else None

    @property
    def fixed(self) -> bool:
        """Whether any limit other than the read timeout applies."""
        return self.first_chunk is not None or self.overall is not None

    def due(self, now: float, last_read: float, paused: bool, first_seen: bool) -> float | None:
        """When an answer's timer is due next: the read timeout from its ``last_read`` (from
        ``now`` while ``paused`` for a client), the first chunk's until ``first_seen``, the
        whole answer's; None: never."""
        due: float | None = None
        if self.read is not None:
            due = (now if paused else last_read) + self.read.seconds
        fixed = self.next_due(first_seen) if self.fixed else None
        if fixed is not None and (due is None or fixed[0] < due):
            due = fixed[0]
        return due

    def passed(
        self, now: float, last_read: float, paused: bool, first_seen: bool
    ) -> Exception | None:
        """The failure of an answer one of whose deadlines has passed by ``now``, if one has
        (the arguments as for :meth:`due`)."""
        fixed = self.next_due(first_seen) if self.fixed else None
        if fixed is not None and fixed[0] <= now:
            return DeadlineHit(fixed[1].name, fixed[1].seconds)
        if self.read is not None and not paused and last_read + self.read.seconds <= now:
            return httpx.ReadTimeout(f"no bytes from upstream for {self.read.seconds:g}s")
        return None

    def next_due(self, first_seen: bool) -> tuple[float, Limit] | None:
        """The earliest fixed deadline (loop time) still to come, and its limit: the first
        chunk's until ``first_seen``, and the whole answer's."""
        due: tuple[float, Limit] | None = None
        if not first_seen and self.first_chunk is not None:
            due = (self.started + self.first_chunk.seconds, self.first_chunk)
        if self.overall is not None:
            at = self.started + self.overall.seconds
            if due is None or at < due[0]:
                due = (at, self.overall)
        return due
