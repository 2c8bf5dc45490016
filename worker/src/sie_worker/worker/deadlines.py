"""The deadlines of one proxied request: the read cap, and a profile's runtime timeouts.

``first_chunk_timeout_s`` bounds the time to the first chunk (the answer's head, or a
stream's first event), ``overall_timeout_s`` the whole answer; the smaller of the read cap
and ``inter_chunk_timeout_s`` is the read timeout between chunks. :class:`Deadlines` wraps
each wait and raises :class:`DeadlineHit` naming the option that passed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from sie_worker.config.runtime import Timeouts

__all__ = ["DeadlineHit", "Deadlines"]

_T = TypeVar("_T")


class Deadlines:
    """The deadlines of one request: the read cap with ``inter_chunk_timeout_s`` (the smaller
    is the read timeout), time to the first chunk, and the whole answer."""

    def __init__(self, read_timeout_s: float | None, timeouts: Timeouts) -> None:
        self.timeouts = timeouts
        caps = [(read_timeout_s, "request_read_timeout_s")]
        caps.append((timeouts.inter_chunk_s, "inter_chunk_timeout_s"))
        known = [(v, n) for v, n in caps if v is not None]
        self.read_s: float | None = min(known)[0] if known else None
        self.read_name: str = min(known)[1] if known else "request_read_timeout_s"
        self._started = asyncio.get_running_loop().time()
        self._first_seen = timeouts.first_chunk_s is None

    def _left(self, first: bool) -> tuple[float | None, str]:
        now = asyncio.get_running_loop().time()
        spent = now - self._started
        left: list[tuple[float, str]] = []
        if first and not self._first_seen and self.timeouts.first_chunk_s is not None:
            left.append((self.timeouts.first_chunk_s - spent, "first_chunk_timeout_s"))
        if self.timeouts.overall_s is not None:
            left.append((self.timeouts.overall_s - spent, "overall_timeout_s"))
        return min(left) if left else (None, "")

    async def first(self, step: Awaitable[_T]) -> _T:
        """Await ``step``: a wait for the next chunk, bounded by the first-chunk deadline
        until one has come, and by the overall one."""
        result = await self._bounded(step, first=True)
        self._first_seen = True
        return result

    async def overall(self, step: Awaitable[_T]) -> _T:
        return await self._bounded(step, first=False)

    async def _bounded(self, step: Awaitable[_T], *, first: bool) -> _T:
        if self._first_seen and self.timeouts.overall_s is None:
            return await step  # the usual case: nothing but the read cap
        left, name = self._left(first)
        if left is None:
            return await step
        deadline = asyncio.timeout(max(left, 0.0))
        try:
            async with deadline:
                return await step
        except TimeoutError:
            if not deadline.expired():
                raise  # the step's own timeout, not ours
            limit = getattr(self.timeouts, name.removesuffix("_timeout_s") + "_s")
            raise DeadlineHit(name, float(limit)) from None


class DeadlineHit(Exception):
    """A deadline passed: ``name`` is the option (``first_chunk_timeout_s``...), ``seconds``
    its value."""

    def __init__(self, name: str, seconds: float) -> None:
        super().__init__(name)
        self.name, self.seconds = name, seconds
