"""A chart pool to start from for one model: GPUs, device group, nodes, /dev/shm, memory.
Pure."""

from __future__ import annotations

import math
from dataclasses import dataclass

from sie_worker.config.widths import rank_width
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

    gpu_count: int  # per pod (per node of a group)
    device_group: bool
    shm_size_gib: int
    memory_request_gib: int
    memory_limit_gib: int
    nodes: int = 1  # gpu.nodes: pods (nodes) of one group


def suggest_pool(width: int, model_weights_bytes: float, *, nodes: int = 1) -> PoolSuggestion:
    """Chart values for a pool that runs one replica per pod, or per group of ``nodes`` pods.

    Per GPU it starts from the l4-4x pool's figures (8Gi shm, 16Gi/32Gi memory); the limit
    also holds the pod's share of the checkpoint plus /dev/shm, since the ranks read their
    shards through host memory while loading and what the engine writes to /dev/shm counts
    against it. A group's pod holds width / nodes GPUs and its pipeline stages' share of the
    weights; a group needs ``gpu.deviceGroup`` (one engine rank per pod).
    """
    gpus = rank_width(width, nodes)
    shm = _SHM_GIB_PER_GPU * gpus
    share = math.ceil(model_weights_bytes / nodes / GIB)
    limit = max(_MEMORY_LIMIT_GIB_PER_GPU * gpus, share + shm)
    request = max(_MEMORY_REQUEST_GIB_PER_GPU * gpus, math.ceil(limit / 2))
    return PoolSuggestion(
        gpu_count=gpus,
        device_group=width > 1,
        shm_size_gib=shm,
        memory_request_gib=request,
        memory_limit_gib=limit,
        nodes=nodes,
    )
