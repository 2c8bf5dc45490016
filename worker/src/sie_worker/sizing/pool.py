"""A chart pool to start from for one model: GPUs, device group, /dev/shm, memory. Pure."""

from __future__ import annotations

import math
from dataclasses import dataclass

from sie_worker.sizing.arithmetic import GIB

__all__ = ["PoolSuggestion", "suggest_pool"]

# The example l4-4x pool's figures: 8Gi of /dev/shm and 16Gi/32Gi (request/limit) of memory
# per GPU.
_SHM_GIB_PER_GPU = 8
_MEMORY_REQUEST_GIB_PER_GPU = 16
_MEMORY_LIMIT_GIB_PER_GPU = 32


@dataclass(frozen=True)
class PoolSuggestion:
    """A starting point for a chart pool: measure the real use, then adjust."""

    gpu_count: int
    device_group: bool
    shm_size_gib: int
    memory_request_gib: int
    memory_limit_gib: int


def suggest_pool(width: int, model_weights_bytes: float) -> PoolSuggestion:
    """Chart values for a pool that runs one replica per pod.

    Per GPU it starts from the l4-4x pool's figures (8Gi shm, 16Gi/32Gi memory); the limit
    also holds the whole checkpoint plus /dev/shm, since the ranks read their shards through
    host memory while loading and what the engine writes to /dev/shm counts against it.
    """
    shm = _SHM_GIB_PER_GPU * width
    limit = max(_MEMORY_LIMIT_GIB_PER_GPU * width, math.ceil(model_weights_bytes / GIB) + shm)
    request = max(_MEMORY_REQUEST_GIB_PER_GPU * width, math.ceil(limit / 2))
    return PoolSuggestion(
        gpu_count=width,
        device_group=width > 1,
        shm_size_gib=shm,
        memory_request_gib=request,
        memory_limit_gib=limit,
    )
