"""The lifecycle of a served model: one transition function moves a record between states.

::

    unloaded / failed --begin--> loading --(phase: downloading -> starting)--> loading
    unloaded / failed --refused--> failed   (refused before it began: a bad config)
    loading --ready--> ready
    loading --failed--> failed        (the load failed: the reason is the error)
    loading --stopped--> unloaded     (cancelled, or no room could be made)
    ready --released--> unloaded      (evicted, unloaded, config removed, shutdown)
    ready --crashed--> failed         (the engine exited on its own)
    failed --cleared--> unloaded      (an unload request)

:meth:`Lifecycle.move` is the only code that assigns a record's ``state``; it refuses any
other step (a bug, never a user error), keeps the fields that belong to a state consistent
(only a loading record has a ``phase``; a model that stops loading or serving holds no
devices, no memory and no engine) and records the reason of the last move. Observers (the
metrics) hear of every move.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType

from sie_worker.model_states import ModelState
from sie_worker.worker.records import LoadPhase, ModelRecord, Move

__all__ = ["ALLOWED", "IllegalTransition", "Lifecycle"]

_log = logging.getLogger("sie_worker.manager")

ALLOWED: Mapping[ModelState, frozenset[ModelState]] = MappingProxyType(
    {
        "unloaded": frozenset({"loading", "unloaded", "failed"}),
        "failed": frozenset({"loading", "unloaded", "failed"}),
        "loading": frozenset({"loading", "ready", "failed", "unloaded"}),
        "ready": frozenset({"unloaded", "failed"}),
    }
)


class IllegalTransition(RuntimeError):
    """A step the lifecycle does not have (a bug in the caller)."""


class Lifecycle:
    """Moves records between states; ``on_change`` runs after every move."""

    def __init__(self, on_change: Callable[[], None] = lambda: None) -> None:
        self._on_change = on_change

    def move(
        self,
        record: ModelRecord,
        to: ModelState,
        reason: str,
        *,
        error: str | None = None,
        phase: LoadPhase | None = None,
    ) -> None:
        """Move ``record`` to ``to`` for ``reason``. ``error`` is the reason a record turns
        ``failed`` (required then; an ``unloaded`` record may keep the refusal of its last
        load); ``phase`` where a loading record is (required then)."""
        before = record.state
        if to not in ALLOWED[before]:
            raise IllegalTransition(f"{record.id}: {before} -> {to} ({reason}) is not a step")
        if (to == "failed" and error is None) or (to in ("loading", "ready") and error):
            raise IllegalTransition(f"{record.id}: -> {to} needs an error exactly when failed")
        if (to == "loading") != (phase is not None):
            raise IllegalTransition(f"{record.id}: -> {to} needs a phase exactly when loading")
        record.state, record.error, record.phase = to, error, phase
        if to != "loading":
            record.download = None
        if to in ("unloaded", "failed"):
            # A model that no longer loads or serves holds nothing.
            record.block, record.memory, record.running = (), None, None
        record.last_move = Move(before, to, reason, time.monotonic())
        if before != to:
            _log.debug("%s: %s -> %s (%s)", record.id, before, to, reason)
        self._on_change()
