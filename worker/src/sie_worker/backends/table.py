"""One backend as the router (a slot's worker) or the gateway (a pod's router) keeps it,
with the rules both follow, and the loop that polls it.

* Dispatch: a request sent counts in ``outstanding`` and per model until it ends; one that
  makes the backend load its model is also recorded in ``pending`` (applied to the last poll
  optimistically, so a burst follows the first request and loads the model once).
* Poll: a poll that started after a pending record supersedes it, unless that request is
  still in flight and the poll does not show its model loading or ready yet (the request
  had not reached the backend when the poll was answered: a loaded machine). An older poll
  that finishes late is ignored.
* Down: ``down_after_failures`` failed polls in a row, or a refused connection, take the
  backend out of rotation and abort its in-flight requests; polling goes on.
* Attempt: each try of a relayed request on a backend is ``async with table.attempt(...)``
  (:class:`Attempt`): entering counts it dispatched, leaving counts it finished, and what
  the relay noted on the way (the status the client got, a refused connection) is what
  the table accounts.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import TypeVar

import anyio

from sie_worker.http.poll import PollError

__all__ = ["Abort", "Attempt", "Backend", "Pending", "poll_loop"]

Abort = Callable[[], None]
# What was dispatched since the last poll: (monotonic time, model, True once it was served).
Pending = tuple[float, str, bool]
_Poll = TypeVar("_Poll")


@dataclass(eq=False)
class Backend:
    url: str
    answering: bool = False  # its last poll succeeded
    # Taken out of rotation (refused, or missed polls) and not back yet; one that has not
    # answered its first poll is not answering, but not down either.
    down: bool = False
    ready: bool = False
    failures: int = 0
    last_error: str | None = None
    polled_at: float = -math.inf  # monotonic start of the poll behind what is known
    pending: list[Pending] = field(default_factory=list)
    outstanding: int = 0
    inflight_by_model: Counter[str] = field(default_factory=Counter)
    aborts: set[Abort] = field(default_factory=set)
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    def note_dispatch(self, model: str | None, at: float, *, loads: bool) -> None:
        """A request was sent; ``loads`` when it makes the backend load ``model``."""
        self.outstanding += 1
        if model is None:
            return
        self.inflight_by_model[model] += 1
        if loads:
            self.pending.append((at, model, False))

    def note_finish(self, model: str | None, at: float, *, served: bool) -> None:
        """A request ended; ``served`` when it should mark ``model`` ready until a poll."""
        self.outstanding -= 1
        if model is None:
            return
        self.inflight_by_model[model] -= 1
        if self.inflight_by_model[model] <= 0:
            del self.inflight_by_model[model]
        if served:
            self.pending.append((at, model, True))

    def accept_poll(self, started_at: float, state_of: Callable[[str], str | None]) -> bool:
        """Take a successful poll that started at ``started_at`` (``state_of``: a model's
        state in it). False, and nothing changes, when a newer poll was taken already."""
        if started_at < self.polled_at:
            return False
        self.polled_at = started_at
        self.pending = [
            p
            for p in self.pending
            if p[0] > started_at
            or (
                not p[2]
                and self.inflight_by_model.get(p[1], 0) > 0
                and state_of(p[1]) not in (None, "loading", "ready")
            )
        ]
        self.failures = 0
        self.last_error = None
        self.answering = True
        self.down = False
        return True

    def note_poll_failure(self, error: PollError, down_after_failures: int) -> bool:
        """Count a failed poll; True when the backend must leave rotation now."""
        self.failures += 1
        self.last_error = str(error)
        return error.refused or self.failures >= down_after_failures

    def take_down(self, reason: str) -> bool:
        """Out of rotation, its in-flight requests aborted; True when it was answering."""
        was_answering = self.answering
        self.answering = False
        self.down = True
        self.ready = False
        self.last_error = reason
        self.pending.clear()
        for abort in list(self.aborts):
            abort()
        self.wake.set()
        return was_answering


@dataclass(eq=False)
class Attempt:
    """One try of a request on ``backend``, as the router and the gateway account for it:
    ``async with`` it around the try. ``key`` is what a retry excludes, ``name`` is for
    messages; ``response_headers`` go on a relayed answer's head, ``error_headers`` on an
    error the relay answers itself after this try. The relay notes what happened:
    :meth:`answered` with the status the client got, ``refused`` when nothing listened.

    A table's subclass does its accounting in :meth:`started`, :meth:`answered` and
    :meth:`ended`."""

    backend: Backend
    key: Hashable
    name: str
    response_headers: Sequence[tuple[bytes, bytes]] = ()
    error_headers: Sequence[tuple[str, str]] = ()
    resume: bool = True  # a stream this try relays may go on elsewhere if it breaks
    status: int | None = None  # the backend's answer, once its head arrived
    refused: str | None = None  # why nothing listened, when nothing did
    # The backend's, as plain attributes: the relay reads them at every step of the try.
    url: str = field(init=False)
    aborts: set[Abort] = field(init=False)  # what cancels its tries when it leaves rotation

    def __post_init__(self) -> None:
        self.url = self.backend.url
        self.aborts = self.backend.aborts

    @property
    def served(self) -> bool:
        return self.status is not None and self.status < 400

    def answered(self, status: int) -> None:
        """The backend's answer (its head) goes to the client with ``status`` (a subclass
        that counts it sets ``status`` too)."""
        self.status = status

    def started(self) -> None:
        """Count the try as dispatched."""

    def ended(self) -> None:
        """Count the try as finished (``refused``, ``served``: what it came to)."""

    async def __aenter__(self) -> Attempt:
        self.started()
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.ended()


async def poll_loop(
    backend: Backend,
    poll: Callable[[], Awaitable[_Poll]],
    applied: Callable[[float, _Poll], None],
    failed: Callable[[PollError], None],
    *,
    interval_s: float,
    clock: Callable[[], float],
    until: Callable[[], bool] = lambda: False,
) -> None:
    """Poll ``backend`` every ``interval_s`` and at once when it is woken, until ``until()``
    (or cancelled): ``applied(started_at, answer)`` or ``failed(error)`` each time."""
    while not until():
        backend.wake.clear()
        started = clock()
        try:
            answer = await poll()
        except PollError as exc:
            failed(exc)
        else:
            applied(started, answer)
        with anyio.move_on_after(interval_s):
            await backend.wake.wait()
