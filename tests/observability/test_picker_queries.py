"""What an endpoint picker reads of a pod, on a real Prometheus scraping real processes.

The Gateway API Inference Extension's pickers (llm-d's router) read four series of each pod
at the port the pool's Service targets (the slot router's): its queue, its running batch,
its KV cache use and the models it holds, in vLLM's ``lora_requests_info`` shape. The chart
is rendered with ServiceMonitors on; Prometheus scrapes, labelled as they would label them,
pod ``sie-warm-0``: router R over worker W0 (fake engines: ``org/s`` with SGLang's series, a
batch of one and a 40-token KV cache; ``org/v`` with vLLM's) and worker W1 (``org/n``, whose
engine exports no metrics, as the default engine; ``org/l``, pinned, loading until the test
lets it finish). The picker's queries (:data:`PICKER`) are evaluated per pod on the router's
series and checked against what the workers expose; waits are on conditions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart._render import render
from tests.support.gateway_fixtures import PodProcess
from tests.support.prometheus import PrometheusProcess, Target, service_monitor_jobs
from tests.support.worker_fixtures import WorkerProcess, fake_model, wait_until

pytestmark = pytest.mark.slow

VALUES: dict[str, Any] = {
    "workers": {
        "pools": {
            "l4": {"enabled": False},
            "warm": {
                "enabled": True,
                "machineProfile": "warm",
                "gpuType": "l4",
                "gpu": {"count": 2},
                "bundles": {"sglang": {"minReplicas": 0, "maxReplicas": 1}},
            },
        }
    },
    "models": {},
    "serviceMonitor": {"enabled": True, "interval": "1s", "scrapeTimeout": "900ms"},
}
POD = 'release="sie",pool="warm",container="router"'
# What a picker reads of each pod (the series names an llm-d router's engine config maps to
# queued requests, running requests, KV cache use and LoRA info), as Prometheus queries.
PICKER = {
    "queued": f"sum by (pod) (sie_worker_requests_waiting{{{POD}}})",
    "running": f"sum by (pod) (sie_worker_requests_running{{{POD}}})",
    "kv_usage": f"max by (pod) (sie_worker_kv_cache_usage_ratio{{{POD}}})",
    "lora": f"sie_worker_lora_requests_info{{{POD}}}",
}
# The same figures from the pod's workers (each worker container is scraped too).
WORKER = 'release="sie",pool="warm",container=~"worker-.*"'
WORKERS = {
    "queued": f"sum by (pod) (sie_worker_requests_waiting{{{WORKER}}})",
    "running": f"sum by (pod) (sie_worker_requests_running{{{WORKER}}})",
    "kv_usage": f"max by (pod) (sie_worker_kv_cache_usage_ratio{{{WORKER}}})",
}
STREAM = {
    "prompt": "a b",
    "max_tokens": 20,
    "stream": True,
    "fake": {"tokens": 400, "token_delay_s": 0.25},
}


def _value(result: list[dict[str, Any]]) -> float | None:
    return float(result[0]["value"][1]) if len(result) == 1 else None


def _lora(result: list[dict[str, Any]]) -> tuple[str, str, str] | None:
    """``(running, waiting, max_lora)`` of the one series, else None."""
    if len(result) != 1 or result[0]["value"][1] != "1":
        return None
    labels = result[0]["metric"]
    return (
        labels.get("running_lora_adapters", ""),
        labels.get("waiting_lora_adapters", ""),
        labels.get("max_lora", ""),
    )


@contextlib.contextmanager
def _streams(worker: WorkerProcess, models: list[str]) -> Iterator[None]:
    """Streams open on ``worker`` (each past its first event) until the block ends."""
    with contextlib.ExitStack() as stack:
        readers = []  # a dropped line iterator would close its stream
        for model in models:
            client = stack.enter_context(worker.client())
            response = stack.enter_context(
                client.stream("POST", "/v1/completions", json={"model": model, **STREAM})
            )
            assert response.status_code == 200, response.read()
            readers.append(response.iter_lines())
            next(readers[-1])
        yield


def _where(
    router: PodProcess, workers: list[WorkerProcess]
) -> Callable[[Mapping[str, Any], str], list[Target]]:
    addresses = {"http": router.url, **{f"worker-{i}": w.url for i, w in enumerate(workers)}}

    def where(deployment: Mapping[str, Any], port: str) -> list[Target]:
        pool = deployment["spec"]["template"]["metadata"]["labels"].get("sie-workers/pool")
        if pool != "warm" or port not in addresses:
            return []
        return [Target(addresses[port].removeprefix("http://"), "sie-warm-0")]

    return where


def test_a_pickers_queries_read_the_pods_queue_running_batch_kv_cache_and_models(
    tmp_path: Path,
    start_worker: Callable[..., WorkerProcess],
    start_pod: Callable[..., PodProcess],
    start_prometheus: Callable[..., PrometheusProcess],
) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(VALUES))
    docs = render(values)
    loaded = tmp_path / "org-l-ready"
    w0 = start_worker(
        [
            fake_model(
                "org/s", env={"FAKE_ENGINE_MAX_RUNNING": "1", "FAKE_ENGINE_KV_TOKENS": "40"}
            ),
            fake_model("org/v", env={"FAKE_ENGINE_METRICS": "vllm"}),
        ],
        devices="cuda:0,cuda:1",
    )
    w1 = start_worker(
        [
            fake_model("org/n", env={"FAKE_ENGINE_METRICS": "none"}),
            fake_model("org/l", env={"FAKE_ENGINE_READY_FILE": str(loaded)}),
        ],
        devices="cuda:0,cuda:1",
        env={"SIE_PINNED_MODELS": "org/l"},
    )
    for worker, models in ((w0, ("org/s", "org/v")), (w1, ("org/n",))):
        with worker.client() as client:
            for model in models:
                assert client.post(f"/v1/models/{model}/load").status_code == 200
    router = start_pod([], workers=[w0, w1], wait=False)
    prometheus = start_prometheus(
        service_monitor_jobs(docs, _where(router, [w0, w1]), interval="1s", timeout="900ms")
    )
    prometheus.wait_for("count(up == 1)", lambda r: _value(r) == 3.0, timeout=60, what="3 up")

    def reads(key: str, expected: object, query: Mapping[str, str] = PICKER) -> None:
        read = _lora if key == "lora" else _value
        prometheus.wait_for(query[key], lambda r: read(r) == expected, what=f"{key} {expected}")

    # --- W0: org/s runs one stream and queues one, its cache full; org/v runs one; W1: org/n
    # runs one (counted by W1, its engine has no series); org/l loads ---------------------
    with _streams(w0, ["org/s", "org/s", "org/v"]), _streams(w1, ["org/n"]):
        reads("queued", 1.0)
        reads("running", 3.0)
        reads("kv_usage", 1.0)
        reads("lora", ("org/n,org/s,org/v", "org/l", "4"))
        for key in WORKERS:  # the router's figures are its workers', summed or the highest
            reads(key, {"queued": 1.0, "running": 3.0, "kv_usage": 1.0}[key], WORKERS)

    # --- the streams end, org/l's load finishes -----------------------------------------
    loaded.touch()
    wait_until(lambda: w1.models()["org/l"]["state"] == "ready", timeout=30)
    reads("queued", 0.0)
    reads("running", 0.0)
    reads("kv_usage", 0.0)
    reads("lora", ("org/l,org/n,org/s,org/v", "", "4"))
