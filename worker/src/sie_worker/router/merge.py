"""Merge every slot's ``/v1/models`` and ``/v1/devices`` into one answer for the pod.

A model appears once (OpenAI clients expect unique ids). Its fields come from the slot
where it is furthest along (ready, then loading, then failed, then unloaded; lowest slot on
a tie); ``slot`` names that slot while the model is ready or loading there (else null), and
``slots`` lists the model's state on every slot.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sie_worker.model_states import progress

__all__ = ["merge_devices", "merge_models"]

_PER_SLOT_FIELDS = (
    "state",
    "devices",
    "pinned",
    "error",
    "last_used",
    "inflight",
    "phase",
    "bytes_done",
    "bytes_total",
    "memory_bytes",
)


def merge_models(answers: Mapping[int, Any]) -> list[dict[str, Any]]:
    """``answers`` maps slot → that slot's ``/v1/models`` body; malformed ones are skipped."""
    per_model: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for slot in sorted(answers):
        body = answers[slot]
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list):
            continue
        for entry in data:
            if isinstance(entry, dict) and isinstance(entry.get("id"), str):
                per_model.setdefault(entry["id"], []).append((slot, entry))
    merged = []
    for entries in per_model.values():
        slot, best = max(entries, key=lambda pair: (progress(pair[1].get("state")), -pair[0]))
        item = dict(best)
        item["slot"] = slot if best.get("state") in ("ready", "loading") else None
        item["slots"] = [
            {"slot": s, **{k: e[k] for k in _PER_SLOT_FIELDS if k in e}} for s, e in entries
        ]
        merged.append(item)
    return merged


def merge_devices(answers: Mapping[int, Any]) -> list[dict[str, Any]]:
    """Every slot's devices in slot order, each with its ``slot``."""
    devices: list[dict[str, Any]] = []
    for slot in sorted(answers):
        body = answers[slot]
        listed = body.get("devices") if isinstance(body, dict) else None
        if not isinstance(listed, list):
            continue
        devices.extend({"slot": slot, **d} for d in listed if isinstance(d, dict))
    return devices
