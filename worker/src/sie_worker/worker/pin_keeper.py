"""Pinned models stay loaded: the keeper loads each pinned model that is not ready and not
loading, and tries again with exponential backoff (1 s doubling to 60 s) while it fails.
A ready load resets the backoff; :meth:`PinKeeper.wake` makes it look again at once
(a pinned model failed, or was pinned)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable

from sie_worker.worker.records import ModelRecord

__all__ = ["MAX_BACKOFF_S", "PinKeeper"]

MAX_BACKOFF_S = 60.0


class PinKeeper:
    def __init__(
        self,
        records: Callable[[], Iterable[ModelRecord]],
        load: Callable[[ModelRecord], object],
    ) -> None:
        self._records = records
        self._load = load
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="pinned-keeper")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def wake(self) -> None:
        self._wake.set()

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            now = time.monotonic()
            next_try = now + MAX_BACKOFF_S
            for record in list(self._records()):
                if not record.pinned or record.state == "ready" or record.load_task:
                    continue
                if record.pinned_retry_at > now:
                    next_try = min(next_try, record.pinned_retry_at)
                    continue
                record.pinned_retry_at = now + record.pinned_backoff_s
                record.pinned_backoff_s = min(record.pinned_backoff_s * 2, MAX_BACKOFF_S)
                next_try = min(next_try, record.pinned_retry_at)
                self._load(record)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=next_try - now)
