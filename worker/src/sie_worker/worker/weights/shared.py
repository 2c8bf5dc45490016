"""Snapshot fetches in threads for the worker: one download per repo and revision at a time,
shared by every load waiting for it. When its last waiter is cancelled (unload, shutdown)
the download stops at its next chunk, and its thread ends before the waiter does."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from sie_worker.worker.weights.cache import HubSettings, Snapshot, SnapshotKey
from sie_worker.worker.weights.download import fetch_snapshot
from sie_worker.worker.weights.progress import Progress

__all__ = ["DownloadHandle", "SnapshotDownloads"]


@dataclass(eq=False)
class _Download:
    key: SnapshotKey
    future: asyncio.Future[Snapshot]
    progress: Progress
    cancel: threading.Event
    waiters: int = 0


@dataclass(eq=False)
class DownloadHandle:
    """One load's share of a download; :meth:`result` waits for the snapshot."""

    _owner: SnapshotDownloads = field(repr=False)
    _download: _Download

    @property
    def progress(self) -> Progress:
        return self._download.progress

    async def result(self) -> Snapshot:
        download = self._download
        try:
            return await asyncio.shield(download.future)
        except asyncio.CancelledError:
            if download.waiters == 1 and not download.future.done():
                # The last waiter leaves: stop the download and wait for its thread, so no
                # file is still being written when the caller moves on.
                download.cancel.set()
                await asyncio.wait([download.future])
            raise
        finally:
            download.waiters -= 1


class SnapshotDownloads:
    """Snapshot fetches in threads: one per repo and revision at a time, shared by every
    load that needs it."""

    def __init__(self, hub: HubSettings, *, parallel: int = 4) -> None:
        self.hub = hub
        self._active: dict[SnapshotKey, _Download] = {}
        self._executor = ThreadPoolExecutor(parallel, "sie-download")

    def join(self, key: SnapshotKey) -> DownloadHandle:
        """Join the download of ``key``, starting it when none runs."""
        download = self._active.get(key)
        if download is None:
            progress, cancel = Progress(), threading.Event()
            loop = asyncio.get_running_loop()
            future = loop.run_in_executor(
                self._executor, fetch_snapshot, key, self.hub, progress, cancel
            )
            download = _Download(key, future, progress, cancel)
            self._active[key] = download
            future.add_done_callback(lambda _: self._forget(download))
        download.waiters += 1
        return DownloadHandle(self, download)

    def _forget(self, download: _Download) -> None:
        if self._active.get(download.key) is download:
            del self._active[download.key]
        if not download.future.cancelled():
            download.future.exception()  # retrieved: failures are reported to the waiters

    async def aclose(self) -> None:
        """Stop every download and wait for their threads."""
        active = list(self._active.values())
        for download in active:
            download.cancel.set()
        if active:
            await asyncio.wait([d.future for d in active])
        # Idle now: its threads end at once, and are gone when this returns.
        await asyncio.get_running_loop().run_in_executor(None, self._executor.shutdown)
