"""The size of the weights an engine loads from a local model folder (a ``model_path``, or a
snapshot in the Hugging Face cache), by the same selection rule as a download
(:func:`~sie_worker.worker.weights.files.plan_files`): one copy of the weights, in the first
format the folder has, the shards its index names."""

from __future__ import annotations

import json
import os
from pathlib import Path

from sie_worker.worker.weights.files import NoWeights, index_shards, plan_files, weight_files

__all__ = ["weight_bytes"]


def weight_bytes(folder: Path) -> int | None:
    """Bytes of the folder's weights; None when it holds none the engines load (or cannot be
    read). Symbolic links (the Hugging Face cache's) count as the files they point to."""
    sizes: dict[str, int] = {}
    try:
        for root, dirs, files in os.walk(folder, followlinks=True):
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            for name in files:
                path = Path(root, name)
                sizes[path.relative_to(folder).as_posix()] = path.stat().st_size
    except OSError:
        return None
    try:
        plan = plan_files(sizes)
        shards: frozenset[str] = frozenset()
        if plan.index is not None:
            shards = index_shards(json.loads((folder / plan.index).read_text()))
        chosen = weight_files(plan, sizes, shards)
    except (NoWeights, OSError, ValueError):
        return None
    return sum(sizes[f] for f in chosen)
