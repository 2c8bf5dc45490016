"""A simulated day of one worker's GPUs: which models are loaded, what each request waits.

Every placement is the real one (``sie_worker.worker.placement.allocator.place`` on the
claims the worker would build); only the engines and the clock are simulated. Requests are
served the moment their model is ready: the simulation counts residency (model loads and
the requests that wait for them), not compute.

- A request for a ready model is served at once and marks it used (``last_used``, as the
  worker's lease does). One for a loading model waits until it is ready.
- One for a model not loaded places it: ``place(budgets, claims, 1, need=..., strategy=...)``
  with ``budgets`` the device count (``exclusive``: memory unknown, one model per device)
  or each device's budget (``spread``, ``pack``: total x the pressure threshold). The models
  it names are evicted (they are ready and idle: requests take no time here), and the
  model loads for its cold start (seed 004 Example 17: start-up + weights / source rate +
  warm-up). Engine starts on one device are serialized, as the worker's are; a loading
  model cannot be evicted. When no room can be made (every device's room is held by
  loading models) the load waits for the next load to finish, then tries again; such
  loads wait in arrival order (the first that still finds no room keeps the others
  waiting).
- A model is marked used when it becomes ready, as the worker does.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from sie_worker.worker.placement.allocator import Claim, NoPlacement, Strategy, place
from sie_worker.worker.placement.memory import DeviceMemory

__all__ = ["APPROACHES", "Approach", "DayResult", "Request", "SimModel", "simulate"]

Approach = Literal["exclusive", "spread", "pack"]
APPROACHES: tuple[Approach, ...] = ("exclusive", "spread", "pack")


@dataclass(frozen=True)
class SimModel:
    name: str
    need_bytes: int  # what it reserves on its device (memory_need)
    load_s: float  # its cold start


@dataclass(frozen=True)
class Request:
    at: float  # seconds since the day began
    model: str


@dataclass(frozen=True)
class DayResult:
    approach: Approach
    gpus: int
    requests: int
    loads: int
    loads_by_model: dict[str, int]
    waited: int  # requests that arrived while their model was not ready
    waits_s: tuple[float, ...]  # each waiting request's wait, in the order they were served
    deferred_loads: int  # loads that found no room at once (all room held by loading models)
    budget_bytes: int | None  # each device's budget (None: memory unknown)
    peak_reserved_bytes: tuple[int, ...]  # per device, the most its models reserved at once
    peak_shared_bytes: tuple[int, ...]  # the same, counted only while it held two or more
    peak_models: tuple[int, ...]  # per device, the most models it held at once

    @property
    def wait_total_s(self) -> float:
        return math.fsum(self.waits_s)


@dataclass
class _Loaded:
    device: int
    memory: int | None
    last_used: float
    ready_at: float | None  # None: ready

    def claim(self, name: str) -> Claim:
        return Claim(
            name, self.device, 1, last_used=self.last_used,
            evictable=self.ready_at is None, memory=self.memory,
        )  # fmt: skip


def simulate(
    models: Sequence[SimModel],
    requests: Sequence[Request],
    gpus: int,
    approach: Approach,
    *,
    gpu_bytes: int,
    threshold_percent: float = 95.0,
) -> DayResult:
    """Serve ``requests`` (in time order) with ``gpus`` devices of ``gpu_bytes`` each."""
    by_name = {m.name: m for m in models}
    memory = approach != "exclusive"
    budgets: int | tuple[int | None, ...] = (
        DeviceMemory("budget", (gpu_bytes,) * gpus, threshold_percent).budgets() if memory else gpus
    )
    strategy: Strategy = "pack" if approach == "pack" else "spread"
    loaded: dict[str, _Loaded] = {}
    waiting: dict[str, list[float]] = {}  # model -> arrival times of its waiting requests
    deferred: list[str] = []  # models whose load found no room yet, first come first
    ready_heap: list[tuple[float, str]] = []
    device_free_at = [0.0] * gpus  # engine starts on one device are serialized
    loads: dict[str, int] = {}
    waits: list[float] = []
    deferrals = 0
    peak_reserved = [0] * gpus
    peak_shared = [0] * gpus
    peak_models = [0] * gpus

    def start_load(name: str, now: float) -> bool:
        model = by_name[name]
        claims = [entry.claim(other) for other, entry in loaded.items()]
        need = model.need_bytes if memory else None
        try:
            placement = place(budgets, claims, 1, need=need, strategy=strategy)
        except NoPlacement:
            return False
        for victim in placement.evict:
            del loaded[victim]
        device = placement.start
        ready_at = max(now, device_free_at[device]) + model.load_s
        device_free_at[device] = ready_at
        loaded[name] = _Loaded(device, need, now, ready_at)
        heapq.heappush(ready_heap, (ready_at, name))
        loads[name] = loads.get(name, 0) + 1
        here = [e for e in loaded.values() if e.device == device]
        reserved = sum(e.memory or 0 for e in here)
        peak_reserved[device] = max(peak_reserved[device], reserved)
        if len(here) > 1:
            peak_shared[device] = max(peak_shared[device], reserved)
        peak_models[device] = max(peak_models[device], len(here))
        return True

    def finish_loads(until: float) -> None:
        while ready_heap and ready_heap[0][0] <= until:
            at, name = heapq.heappop(ready_heap)
            entry = loaded[name]
            entry.last_used, entry.ready_at = at, None
            waits.extend(at - arrived for arrived in waiting.pop(name, []))
            # Room may have been made for the loads that found none: first come, first
            # served; the first that still finds none keeps the others waiting.
            while deferred and start_load(deferred[0], at):
                deferred.pop(0)

    for request in requests:
        finish_loads(request.at)
        entry = loaded.get(request.model)
        if entry is not None and entry.ready_at is None:
            entry.last_used = request.at
            continue
        waiting.setdefault(request.model, []).append(request.at)
        if entry is None and request.model not in deferred:
            started = start_load(request.model, request.at)
            if not started:
                deferred.append(request.model)
                deferrals += 1
    finish_loads(math.inf)
    if deferred:  # nothing is loading, so nothing could ever make room
        raise RuntimeError(f"no room can be made for {', '.join(deferred)} on {gpus} device(s)")
    return DayResult(
        approach=approach,
        gpus=gpus,
        requests=len(requests),
        loads=sum(loads.values()),
        loads_by_model=dict(sorted(loads.items())),
        waited=len(waits),
        waits_s=tuple(waits),
        deferred_loads=deferrals,
        budget_bytes=budgets[0] if isinstance(budgets, tuple) else None,
        peak_reserved_bytes=tuple(peak_reserved),
        peak_shared_bytes=tuple(peak_shared),
        peak_models=tuple(peak_models),
    )
