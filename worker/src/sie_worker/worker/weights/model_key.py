"""The snapshot a served model's weights come from: its ``hf_id`` at its revision, with the
weight files its engine family selects (``EngineFamily.weight_selection``: llama.cpp takes
the profile's ``gguf_file``). The worker's loads, ``sie-worker fetch`` and ``sie-worker
plan`` all build the key here, so they agree on what a complete snapshot is."""

from __future__ import annotations

from sie_worker.config.adapters import NotServedHere, UnknownAdapter
from sie_worker.config.load.load_options import adapter_of
from sie_worker.config.model import ServedModel
from sie_worker.engines.registry import family_of
from sie_worker.settings import Settings
from sie_worker.worker.weights.cache import SnapshotKey

__all__ = ["model_key"]


def model_key(served: ServedModel, settings: Settings) -> SnapshotKey:
    """The snapshot of ``served``'s hub weights. A profile whose adapter this image does not
    run gets the usual choice of weights (its load refuses it before any download)."""
    try:
        family = family_of(adapter_of(served, settings).engine)
    except (UnknownAdapter, NotServedHere):
        weights: tuple[str, ...] = ()
    else:
        weights = family.weight_selection(served.profile.loadtime)
    return SnapshotKey.of(served.config.hf_id, served.revision, weights)
