"""The download step of a model load: the model's snapshot and its hub LoRA adapters'
snapshots, from the cache or the hub (shared, resumable, trusted only complete), with
metrics; the load options then point the engine at the local folders.

The manager decides when this step runs (before any device is claimed) and what the
record shows meanwhile; this module only fetches.
"""

from __future__ import annotations

import dataclasses
import logging

import anyio

from sie_worker.config.load.load_options import LoadOptions
from sie_worker.config.load.loadtime import resolve_load_options
from sie_worker.config.lora import LoraAdapter
from sie_worker.config.model import ServedModel
from sie_worker.settings import Settings
from sie_worker.worker.metrics import WorkerMetrics
from sie_worker.worker.weights.cache import HubSettings, SnapshotKey
from sie_worker.worker.weights.model_key import model_key
from sie_worker.worker.weights.progress import Progress
from sie_worker.worker.weights.shared import DownloadHandle, SnapshotDownloads

__all__ = ["ModelWeights"]

_log = logging.getLogger("sie_worker.manager")


class ModelWeights:
    """Fetches what a served model's engine reads from disk. Finish with :meth:`aclose`."""

    def __init__(self, hub: HubSettings, metrics: WorkerMetrics, settings: Settings) -> None:
        self._downloads = SnapshotDownloads(hub)
        self._metrics = metrics
        self._settings = settings

    def join(self, served: ServedModel) -> DownloadHandle:
        """Join (or start) the download of the model's snapshot; its progress is live."""
        return self._downloads.join(model_key(served, self._settings))

    async def local_options(
        self, model_id: str, served: ServedModel, handle: DownloadHandle
    ) -> LoadOptions:
        """The load options once the snapshot (``handle``) and the adapters are local."""
        with self._metrics.downloading(model_id, handle.progress) as track:
            snapshot = await handle.result()
            track.outcome = "cached" if snapshot.cached else "downloaded"
        if not snapshot.cached:
            _log.info("%s: weights downloaded to %s", model_id, snapshot.path)
        # Now that config.json is in the cache, the head-count rule can be checked.
        options = await anyio.to_thread.run_sync(resolve_load_options, served, self._settings)
        loras = await self._adapters(model_id, options.loras)
        return dataclasses.replace(options, model_path=str(snapshot.path), loras=loras)

    async def _adapters(
        self, model_id: str, loras: tuple[LoraAdapter, ...]
    ) -> tuple[LoraAdapter, ...]:
        """The adapters with each hub one's source replaced by its snapshot folder."""
        local = []
        for lora in loras:
            if lora.local:
                local.append(lora)
                continue
            key = SnapshotKey.of(lora.source, lora.revision)
            with self._metrics.downloading(f"{model_id}:{lora.name}", Progress()) as track:
                snapshot = await self._downloads.join(key).result()
                track.outcome = "cached" if snapshot.cached else "downloaded"
            local.append(dataclasses.replace(lora, source=str(snapshot.path)))
        return tuple(local)

    async def aclose(self) -> None:
        """Stop every download and wait for their threads."""
        await self._downloads.aclose()
