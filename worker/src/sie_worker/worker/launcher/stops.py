"""Engines on their way out: stopped in the background, their devices held until gone.

An evicted or unloaded model's claim ends at once, but its engine may still be draining
in-flight requests (bounded by ``drain_timeout_s``) and then exiting (SIGTERM, SIGKILL
after ``engine_stop_grace_s``). A load placed on those devices first waits for
:meth:`EngineStops.pending_on` its block, so two engines never share a device.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine, Iterable
from typing import Any

from sie_worker.settings import Settings
from sie_worker.worker.launcher.start import RunningEngine

__all__ = ["EngineStops", "consume_exception"]

_log = logging.getLogger("sie_worker.manager")


class EngineStops:
    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._by_device: dict[int, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()  # keep background tasks referenced

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """Run ``coro`` in the background, referenced until done, its exception consumed."""
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(consume_exception)
        return task

    def stop(
        self, model_id: str, running: RunningEngine | None, block: tuple[int, ...], *, drain: bool
    ) -> asyncio.Task[None]:
        """Stop ``running`` (after its in-flight requests, when ``drain``) in the background;
        the devices of ``block`` count as held until it is gone."""
        task = self.spawn(self._stop(model_id, running, drain=drain), f"stop:{model_id}")
        for index in block:
            self._by_device[index] = task
        task.add_done_callback(lambda t: self._forget(t, block))
        return task

    def pending_on(self, block: Iterable[int]) -> list[asyncio.Task[None]]:
        """The stops a load on ``block`` must wait for."""
        return [self._by_device[i] for i in block if i in self._by_device]

    async def wait_all(self) -> None:
        await asyncio.gather(*self._by_device.values(), return_exceptions=True)

    def _forget(self, task: asyncio.Task[None], block: tuple[int, ...]) -> None:
        for index in block:
            if self._by_device.get(index) is task:
                del self._by_device[index]

    async def _stop(self, model_id: str, running: RunningEngine | None, *, drain: bool) -> None:
        if running is None:
            return
        running.engine.stopping = True
        if drain and running.inflight:
            _log.info("%s: draining %d request(s)", model_id, running.inflight)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(running.idle.wait(), timeout=self._settings.drain_timeout_s)
        running.connections.close()  # from this side first: no TIME_WAIT on the engine's port
        await running.engine.stop(self._settings.engine_stop_grace_s)


def consume_exception(task: asyncio.Task[Any]) -> None:
    """Mark a background task's exception as retrieved (its owner reports it otherwise)."""
    if not task.cancelled():
        task.exception()
