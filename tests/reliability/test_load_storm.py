"""A load storm: 200 concurrent requests for 6 models on 2 devices, with real engines that take
0.3-1 s to start, while a poller checks the claims throughout.

Each request is a client that honours ``Retry-After`` (up to 4 tries, as a real client would);
every single answer must be a 200 or a worker error with ``Retry-After``. Streams that
started must end with ``[DONE]``. The poller reads ``/v1/devices``, ``/v1/models`` and
``/v1/devices`` again; every snapshot must hold each device once, and when both device reads
agree, the models' view must agree with them.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx
from sie_worker.errors import InvalidConfig, Unauthorized

from tests.reliability._support import (
    LOAD_ERRORS,
    Launcher,
    Worker,
    assert_clean,
    assert_consistent,
    error_statuses,
)
from tests.support.worker_fixtures import fake_model

_REQUESTS = 200
_TRIES = 4
# Every answer is a 200 or one of these errors; model_loading is a Prefer: wait (RFC 7240)
# answered before the load finished.
_ERROR_STATUS = error_statuses(InvalidConfig, Unauthorized, *LOAD_ERRORS)
_MODELS = {  # id -> (width, task, start delay)
    "org/g1": (1, "generate", "0.3"),
    "org/g2": (1, "generate", "0.5"),
    "org/g3": (1, "generate", "0.8"),
    "org/e1": (1, "encode", "0.4"),
    "org/tp-a": (2, "generate", "1.0"),
    "org/tp-b": (2, "generate", "0.6"),
}


@dataclass
class _Poller:
    worker: Worker
    stop: threading.Event = field(default_factory=threading.Event)
    snapshots: int = 0
    compared: int = 0
    claims_seen: int = 0
    failures: list[str] = field(default_factory=list)

    def run(self) -> None:
        with self.worker.client() as client:
            while not self.stop.is_set():
                try:
                    self._check(client)
                except AssertionError as exc:
                    self.failures.append(str(exc))
                except httpx.HTTPError as exc:
                    self.failures.append(f"poll failed: {exc!r}")

    def _check(self, client: httpx.Client) -> None:
        first = _devices(client)
        models = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
        second = _devices(client)
        self.snapshots += 1
        for devices in (first, second):
            assert len(devices) == 2
        claimed = [d for m in models.values() for d in m["devices"]]
        assert len(claimed) == len(set(claimed)), f"a device is claimed twice: {models}"
        self.claims_seen += bool(claimed)
        if first == second:  # nothing moved between the reads: the views must agree
            self.compared += 1
            assert_consistent(models, first)


def _devices(client: httpx.Client) -> dict[str, str | None]:
    return {d["device"]: d["model"] for d in client.get("/v1/devices").json()["devices"]}


def _request(index: int) -> tuple[str, dict[str, Any], dict[str, str]]:
    model = list(_MODELS)[index % len(_MODELS)]
    headers = {"Prefer": "wait=0"} if index % 10 == 9 else {}
    if _MODELS[model][1] == "encode":
        return "/v1/embeddings", {"model": model, "input": f"text {index}"}, headers
    if index % 3 == 0:
        messages = [{"role": "user", "content": f"hello {index}"}]
        body = {"model": model, "messages": messages, "max_tokens": 4, "stream": index % 2 == 0}
        return "/v1/chat/completions", body, headers
    body = {"model": model, "prompt": f"hello {index}", "max_tokens": 4, "stream": index % 2 == 1}
    return "/v1/completions", body, headers


async def _client(http: httpx.AsyncClient, index: int, answers: list[str]) -> list[str]:
    """One client: try until served (up to 4 tries); return what was wrong with any answer."""
    path, body, headers = _request(index)
    problems: list[str] = []
    for _ in range(_TRIES):
        async with http.stream("POST", path, json=body, headers=headers) as response:
            payload = await response.aread()
        if response.status_code == 200:
            answers.append("200")
            if body.get("stream") and not payload.rstrip().endswith(b"data: [DONE]"):
                problems.append(f"stream of {body['model']} ended with {payload[-300:]!r}")
            return problems
        error = httpx.Response(response.status_code, content=payload).json()["error"]
        code = error["code"]
        answers.append(code)
        retry_after = response.headers.get("retry-after", "")
        if _ERROR_STATUS.get(code) != response.status_code or not retry_after.isdigit():
            problems.append(f"{response.status_code} {error} (Retry-After: {retry_after!r})")
            return problems
        await asyncio.sleep(min(float(retry_after), 1.5) * random.uniform(0.5, 1.0))
    answers.append("gave up")
    return problems


async def _storm(worker: Worker, answers: list[str]) -> list[str]:
    # Idle connections are dropped after 1 s, well before the worker's 75 s keep-alive (see
    # test_bad_input's keep-alive test), so no request races a connection being closed.
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None, keepalive_expiry=1)
    async with httpx.AsyncClient(base_url=worker.url, timeout=120, limits=limits) as http:
        results = await asyncio.gather(*(_client(http, i, answers) for i in range(_REQUESTS)))
    return [problem for problems in results for problem in problems]


def test_storm_of_200_requests_for_6_models_on_2_devices_keeps_claims_exclusive_and_answers(
    launcher: Launcher,
) -> None:
    configs = [
        fake_model(
            model,
            width=width,
            task=task,
            env={"FAKE_ENGINE_START_DELAY_S": delay, "FAKE_ENGINE_TOKEN_DELAY_S": "0.01"},
        )
        for model, (width, task, delay) in _MODELS.items()
    ]
    worker = launcher.start(configs, env={"SIE_DRAIN_TIMEOUT_S": "30"})
    poller = _Poller(worker)
    thread = threading.Thread(target=poller.run, daemon=True)
    thread.start()
    answers: list[str] = []
    try:
        problems = asyncio.run(_storm(worker, answers))
    finally:
        poller.stop.set()
        thread.join(30)
    assert not problems, problems[:5]
    assert not poller.failures, poller.failures[:5]
    assert poller.compared > 0
    assert poller.claims_seen > 0
    tally = Counter(answers)
    assert tally["200"] > 0
    assert tally["200"] + tally["gave up"] == _REQUESTS
    with worker.client() as client:
        metrics = client.get("/metrics").text
    assert 'sie_model_evictions_total{reason="make_room"}' in metrics  # the storm evicted
    assert_clean(worker, probe="org/g1")
