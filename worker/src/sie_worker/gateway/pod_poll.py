"""One poll of a pod's router (``/v1/models``, ``/v1/devices``, ``/readyz``), read into what
the gateway keeps of the pod (:class:`PodPoll`); the background loop that sends it is the
fleet's (:mod:`sie_worker.gateway.state`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from sie_worker.http.poll import PollError, poll_answers

__all__ = ["PodPoll", "parse_pod_devices", "parse_pod_models", "parse_slot_width", "poll_pod"]


@dataclass(frozen=True)
class PodPoll:
    models: dict[str, str]  # model -> state (the best over the pod's slots)
    widths: dict[str, int]
    free_run: int  # widest run of free devices within one slot
    slots: int
    ready_slots: int
    ready: bool
    slot_width: int = 0  # devices of the widest slot (0: not known)


async def poll_pod(
    client: httpx.AsyncClient, url: str, headers: Mapping[str, str], timeout_s: float
) -> PodPoll:
    """One poll of one pod's router: its models, its devices and its slots' readiness."""
    models_r, devices_r, ready_r = await poll_answers(client, url, headers, timeout_s)
    try:
        models, widths = parse_pod_models(models_r.json())
        devices = devices_r.json()
        free_run, slot_width = parse_pod_devices(devices), parse_slot_width(devices)
        slots, ready_slots = _slots(ready_r)
    except ValueError as exc:
        raise PollError(f"{url}: unusable answer: {exc}") from exc
    ready = ready_r.status_code == 200
    return PodPoll(models, widths, free_run, slots, ready_slots, ready, slot_width)


def parse_pod_models(body: Any) -> tuple[dict[str, str], dict[str, int]]:
    """``/v1/models`` of a pod router (or a worker) → states and widths by model id."""
    if not isinstance(body, dict) or not isinstance(body.get("data"), list):
        raise ValueError('/v1/models: expected {"data": [...]}')
    states: dict[str, str] = {}
    widths: dict[str, int] = {}
    for entry in body["data"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
            raise ValueError("/v1/models: every entry needs a string id")
        if isinstance(entry.get("parent"), str):
            continue  # a LoRA adapter lives on its base model, which is listed itself
        state = entry.get("state")
        states[entry["id"]] = state if isinstance(state, str) else "unloaded"
        width = entry.get("width")
        if isinstance(width, int) and not isinstance(width, bool) and width >= 1:
            widths[entry["id"]] = width
    return states, widths


def parse_pod_devices(body: Any) -> int:
    """``/v1/devices`` of a pod router → the widest run of free devices within one slot
    (devices without a ``slot``, as a worker lists them, are one slot)."""
    if not isinstance(body, dict) or not isinstance(body.get("devices"), list):
        raise ValueError('/v1/devices: expected {"devices": [...]}')
    runs: dict[object, int] = {}
    best: dict[object, int] = {}
    for entry in body["devices"]:
        if not isinstance(entry, dict):
            raise ValueError("/v1/devices: every entry must be an object")
        slot = entry.get("slot")
        run = runs.get(slot, 0) + 1 if entry.get("model") is None else 0
        runs[slot] = run
        best[slot] = max(best.get(slot, 0), run)
    return max(best.values(), default=0)


def parse_slot_width(body: Any) -> int:
    """``/v1/devices`` of a pod router → the devices of its widest slot (devices without
    a ``slot``, as a worker lists them, are one slot); 0 when it lists none."""
    counts: Counter[object] = Counter()
    for entry in body.get("devices") or [] if isinstance(body, dict) else []:
        if isinstance(entry, dict):
            counts[entry.get("slot")] += 1
    return max(counts.values(), default=0)


def _slots(ready: httpx.Response) -> tuple[int, int]:
    try:
        body = ready.json()
    except ValueError:
        return 0, 0
    slots = body.get("slots") if isinstance(body, dict) else None
    if not isinstance(slots, list):
        return 0, 1 if ready.status_code == 200 else 0
    return len(slots), sum(1 for s in slots if isinstance(s, dict) and s.get("ready"))
