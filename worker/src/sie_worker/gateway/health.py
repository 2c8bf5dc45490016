"""The gateway's views of the fleet: cluster health (``GET /health``, SIE's shape, what
``sie-sdk``'s ``get_capacity()`` reads) and the union of the pools' ``/v1/models``.

Cluster health lists every discovered pod as a worker (pools at zero replicas have none):
``gpu`` is the pool's machine profile (else its GPU type, never null), ``gpu_count`` its
serving slots, not GPUs, ``ready_gpu_slots`` the slots whose worker is ready, and
``models`` / ``loaded_models`` the models ready on it. ``cluster`` counts the healthy pods
(answering and ready) and their slots; ``status`` is ``healthy`` while at least one is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sie_worker.gateway.state import Group

__all__ = ["cluster_health", "merge_model_lists"]

_RANK = {"ready": 3, "loading": 2, "failed": 1}
_SIE_RANK = {"loaded": 3, "loading": 2, "failed": 1}


def cluster_health(groups: Iterable[Group]) -> dict[str, Any]:
    groups = list(groups)
    workers: list[dict[str, Any]] = []
    models: dict[str, dict[str, Any]] = {}
    for group in groups:
        spec = group.spec
        for pod in sorted(group.pods.values(), key=lambda p: p.name):
            if pod.removed:
                continue
            healthy = pod.routable
            ready = sorted(m for m, s in pod.models.items() if s == "ready") if healthy else []
            workers.append(
                {
                    "name": pod.name,
                    "url": pod.url,
                    "pool": spec.pool,
                    "bundle": spec.bundle,
                    "gpu": spec.gpu,
                    "gpu_type": spec.gpu_type,
                    "machine_profile": spec.machine_profile,
                    "gpu_count": pod.slots,
                    "slot_width": spec.slot_width,
                    "ready_gpu_slots": pod.ready_slots if healthy else 0,
                    "healthy": healthy,
                    "models": ready,
                    "loaded_models": ready,
                    "queue_depth": pod.outstanding,
                    "inflight": pod.outstanding,
                    "error": None if healthy else pod.last_error,
                }
            )
            for model in ready:
                entry = models.setdefault(
                    model,
                    {
                        "name": model,
                        "state": "loaded",
                        "worker_count": 0,
                        "gpu_types": [],
                        "total_queue_depth": 0,
                    },
                )
                entry["worker_count"] += 1
                if spec.gpu not in entry["gpu_types"]:
                    entry["gpu_types"].append(spec.gpu)
                entry["total_queue_depth"] += pod.inflight_by_model.get(model, 0)
    healthy_workers = [w for w in workers if w["healthy"]]
    return {
        "status": "healthy" if healthy_workers else "degraded",
        "type": "gateway",
        "cluster": {
            "worker_count": len(healthy_workers),
            "gpu_count": sum(w["gpu_count"] for w in healthy_workers),
            "models_loaded": len(models),
        },
        "configured_gpu_types": sorted({g.spec.gpu for g in groups}),
        "live_gpu_types": sorted({w["gpu"] for w in healthy_workers}),
        "workers": workers,
        "models": [models[m] for m in sorted(models)],
        "pools": [
            {
                "pool": g.spec.pool,
                "bundle": g.spec.bundle,
                "gpu": g.spec.gpu,
                "machine_profile": g.spec.machine_profile,
                "gpu_type": g.spec.gpu_type,
                "slots": g.spec.slots,
                "slot_width": g.spec.slot_width,
                "pods": sum(1 for p in g.pods.values() if not p.removed),
                "ready_pods": len(g.routable()),
                "pending_requests": g.held,
            }
            for g in groups
        ],
    }


def merge_model_lists(
    answers: Sequence[tuple[Mapping[str, str], Any]], configured: Iterable[str]
) -> dict[str, Any]:
    """One ``/v1/models`` body from every pod's: ``answers`` pairs each pod's labels
    (``pool``, ``bundle``, ``pod``) with its body. A model appears once, with the fields of
    the pod where it is furthest along and ``pools`` listing its state on every pod;
    configured models no pod lists (their pools at zero) are ``unloaded``. SIE's ``models``
    list is merged the same way (by ``name``)."""
    data: dict[str, tuple[int, dict[str, Any]]] = {}
    where: dict[str, list[dict[str, Any]]] = {}
    sie: dict[str, tuple[int, dict[str, Any]]] = {}
    for labels, body in answers:
        if not isinstance(body, dict):
            continue
        for entry in body.get("data") or []:
            if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
                continue
            rank = _RANK.get(str(entry.get("state")), 0)
            if entry["id"] not in data or rank > data[entry["id"]][0]:
                data[entry["id"]] = (rank, entry)
            where.setdefault(entry["id"], []).append({**labels, "state": entry.get("state")})
        for entry in body.get("models") or []:
            if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                continue
            rank = _SIE_RANK.get(str(entry.get("state")), 0)
            if entry["name"] not in sie or rank > sie[entry["name"]][0]:
                sie[entry["name"]] = (rank, entry)
    for model in configured:
        if model not in data:
            data[model] = (0, {"id": model, "object": "model", "state": "unloaded"})
        if model not in sie:
            sie[model] = (0, {"name": model, "loaded": False, "state": "available"})
    merged = []
    for model in sorted(data):
        entry = dict(data[model][1])
        for key in ("slot", "slots"):  # one pod's slots mean nothing across pods
            entry.pop(key, None)
        entry["pools"] = where.get(model, [])
        merged.append(entry)
    return {
        "object": "list",
        "data": merged,
        "models": [sie[m][1] for m in sorted(sie)],
    }
