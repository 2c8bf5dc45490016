"""The chart pool and the layout ``sie-worker size`` proposes: JSON and table lines.

A pool runs one replica per pod, or one group of ``gpu.nodes`` pods for a model that needs
more GPUs than a node has; then the model's load options (tensor x pipeline parallel) are
printed beside it, since the pool's ``gpu.count`` x ``gpu.nodes`` must equal their product.
"""

from __future__ import annotations

from typing import Any

from sie_worker.sizing.layout import Layout, layout_summary
from sie_worker.sizing.pool import PoolSuggestion

__all__ = ["layout_json", "pool_json", "pool_lines"]


def pool_json(pool: PoolSuggestion | None) -> dict[str, Any] | None:
    if pool is None:
        return None
    gpu: dict[str, Any] = {"count": pool.gpu_count}
    if pool.device_group:
        gpu["deviceGroup"] = True
    if pool.nodes > 1:
        gpu["nodes"] = pool.nodes
    return {
        "gpu": gpu,
        "shmSize": f"{pool.shm_size_gib}Gi",
        "resources": {
            "requests": {"memory": f"{pool.memory_request_gib}Gi"},
            "limits": {"memory": f"{pool.memory_limit_gib}Gi"},
        },
    }


def layout_json(layout: Layout) -> dict[str, Any]:
    return {
        "summary": layout_summary(layout),
        "gpus_needed": layout.gpus_needed,
        "tensor_parallel_size": layout.tensor_parallel_size,
        "pipeline_parallel_size": layout.pipeline_parallel_size,
        "nodes": layout.nodes,
        "gpus_per_rank": layout.gpus_per_rank,
        "replicas": layout.replicas,
        "nodes_on_hand": layout.nodes_on_hand,
        "interconnect": "nvlink" if layout.nvlink else "pcie",
        "expert_parallel": layout.expert_parallel,
    }


def pool_lines(suggestion: PoolSuggestion | None, layout: Layout) -> list[str]:
    pool = pool_json(suggestion)
    if pool is None:
        return []
    lines = [
        "pool (chart values to start from; measure, then adjust):",
        "  gpu:",
        f"    count: {pool['gpu']['count']}",
    ]
    if pool["gpu"].get("deviceGroup"):
        lines.append("    deviceGroup: true")
    if "nodes" in pool["gpu"]:
        lines.append(f"    nodes: {pool['gpu']['nodes']}")
    resources = pool["resources"]
    lines += [
        f"  shmSize: {pool['shmSize']}",
        "  resources:",
        "    requests:",
        f"      memory: {resources['requests']['memory']}",
        "    limits:",
        f"      memory: {resources['limits']['memory']}",
    ]
    if layout.pipeline_parallel_size not in (None, 1):
        lines += [
            "model config (profiles.<name>.adapter_options.loadtime):",
            f"  tensor_parallel_size: {layout.tensor_parallel_size}",
            f"  pipeline_parallel_size: {layout.pipeline_parallel_size}",
        ]
    return lines
