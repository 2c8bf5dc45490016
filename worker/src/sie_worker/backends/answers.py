"""One poll of a backend (a worker, or a pod's slot router) read into :class:`BackendPoll`.

A worker and a pod router answer ``/v1/models``, ``/v1/devices`` and ``/readyz`` in the same
shapes (a router adds ``slot`` to each device and ``slots`` to its readiness), so the router
and the gateway read them here, once; each keeps what its policy needs of it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import httpx

from sie_worker.http.poll import PollError, poll_answers
from sie_worker.model_states import ModelState, parse_state

__all__ = [
    "BackendPoll",
    "DeviceEntry",
    "ModelEntry",
    "parse_devices",
    "parse_models",
    "parse_readiness",
    "poll_backend",
]


@dataclass(frozen=True)
class ModelEntry:
    """One model of a ``/v1/models`` answer (LoRA adapters are their base's)."""

    state: ModelState = "unloaded"
    width: int | None = None  # devices it takes, when the answer says
    pinned: bool = False
    last_used: float | None = None  # unix seconds
    inflight: int = 0
    memory_bytes: int | None = None  # what it reserves (or would) on each of its devices
    # Its LoRA adapters the backend serves now (listed as ``<id>:<adapter>``, ready).
    adapters: frozenset[str] = frozenset()


@dataclass(frozen=True)
class DeviceEntry:
    """One device of a ``/v1/devices`` answer."""

    device: str
    models: tuple[str, ...] = ()  # every model on it, in the order they were placed
    slot: object = None  # the router's slot of the device (None: a worker's own list)
    budget_bytes: int | None = None  # what its models may reserve (None: not known)
    reserved_bytes: int | None = None

    @property
    def model(self) -> str | None:
        return self.models[0] if self.models else None

    @property
    def room_bytes(self) -> int | None:
        """Memory left for one more model (None: the worker does not know its memory)."""
        if self.budget_bytes is None:
            return None
        return max(0, self.budget_bytes - (self.reserved_bytes or 0))


@dataclass(frozen=True)
class BackendPoll:
    models: dict[str, ModelEntry]
    devices: tuple[DeviceEntry, ...]
    ready: bool  # /readyz answered 200
    slots: int = 0  # a router's slots (0: not a router, or not said)
    ready_slots: int = 0


async def poll_backend(
    client: httpx.AsyncClient, url: str, headers: Mapping[str, str], timeout_s: float
) -> BackendPoll:
    """One poll of one backend: its models, its devices and its readiness."""
    models_r, devices_r, ready_r = await poll_answers(client, url, headers, timeout_s)
    try:
        models = parse_models(models_r.json())
        devices = parse_devices(devices_r.json())
    except ValueError as exc:
        raise PollError(f"{url}: unusable answer: {exc}") from exc
    ready = ready_r.status_code == 200
    try:
        readiness: Any = ready_r.json()
    except ValueError:
        readiness = None
    slots, ready_slots = parse_readiness(readiness, ready)
    return BackendPoll(models, devices, ready, slots, ready_slots)


def parse_models(body: Any) -> dict[str, ModelEntry]:
    """``/v1/models`` → entries by id; raises ValueError when the shape is not a worker's."""
    if not isinstance(body, dict) or not isinstance(body.get("data"), list):
        raise ValueError('/v1/models: expected {"data": [...]}')
    models: dict[str, ModelEntry] = {}
    adapters: dict[str, set[str]] = {}
    for entry in body["data"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
            raise ValueError("/v1/models: every entry needs a string id")
        parent = entry.get("parent")
        if isinstance(parent, str):
            # A LoRA adapter lives on its base model, which is listed itself.
            if entry["id"].startswith(f"{parent}:") and entry.get("state") == "ready":
                adapters.setdefault(parent, set()).add(entry["id"][len(parent) + 1 :])
            continue
        width = _count(entry.get("width"))
        if width is None or width < 1:
            devices = entry.get("devices")
            width = len(devices) if isinstance(devices, list) and devices else None
        models[entry["id"]] = ModelEntry(
            state=parse_state(entry.get("state")),
            width=width,
            pinned=entry.get("pinned") is True,
            last_used=_finite(entry.get("last_used")),
            inflight=max(_count(entry.get("inflight")) or 0, 0),
            memory_bytes=_count(entry.get("memory_bytes")),
        )
    for parent, names in adapters.items():
        if parent in models:
            models[parent] = replace(models[parent], adapters=frozenset(names))
    return models


def parse_devices(body: Any) -> tuple[DeviceEntry, ...]:
    """``/v1/devices`` → the devices in the answer's order."""
    if not isinstance(body, dict) or not isinstance(body.get("devices"), list):
        raise ValueError('/v1/devices: expected {"devices": [...]}')
    devices: list[DeviceEntry] = []
    for entry in body["devices"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("device"), str):
            raise ValueError("/v1/devices: every entry needs a string device")
        listed = entry.get("models")
        first = entry.get("model")
        if isinstance(listed, list):
            models = tuple(m for m in listed if isinstance(m, str))
        else:  # an answer from before devices were shared lists the one model
            models = (first,) if isinstance(first, str) else ()
        devices.append(
            DeviceEntry(
                entry["device"],
                models,
                entry.get("slot"),
                _count(entry.get("memory_budget_bytes")),
                _count(entry.get("memory_reserved_bytes")),
            )
        )
    return tuple(devices)


def parse_readiness(body: Any, ready: bool) -> tuple[int, int]:
    """A router's ``/readyz`` body → (slots, ready slots); a worker's: (0, 1 if ready)."""
    slots = body.get("slots") if isinstance(body, dict) else None
    if not isinstance(slots, list):
        return 0, 1 if ready else 0
    return len(slots), sum(1 for s in slots if isinstance(s, dict) and s.get("ready"))


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _finite(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None
