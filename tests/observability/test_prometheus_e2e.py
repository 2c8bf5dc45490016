"""Every query the chart renders, evaluated by a real Prometheus scraping real processes.

The chart is rendered (``helm template``) for release ``sie`` with two pools, ``warm`` (two
slots) and ``cold`` (one), alerts, dashboards and KEDA on; every KEDA trigger query, alert
expression and dashboard panel target is taken from that render. Prometheus scrapes real
processes with the labels the rendered ServiceMonitors give them (tests/support/prometheus):

- pod ``warm``: router R1 over worker W0 (two devices; fake engines, ``org/gen``'s with vLLM's
  metric names, the others with SGLang's) and worker W1
  (one device, a pinned model whose load the test finishes by creating a file);
- pod ``cold``: router R2 in front of W1 (its worker series are not scraped twice), so the
  cold pool has no ready pod until W1 is;
- the gateway in front of both pools, holding requests for ``SIE_GATEWAY_HOLD_S`` as the
  rendered gateway Deployment sets it.

Every target is scraped a second time as release ``other`` (the chart rendered for that
release, same namespace, same pool names): a query that does not select the release
counts everything twice and fails its check.

Scenarios, each checked through the rendered queries while it lasts: streams in flight
(3 open streams: inflight 3; an engine whose batch holds one: one waiting, KV cache full),
a request queued at the router behind the pinned slow load, a slow load (loading 2, then
1), a held request at the cold pool (pending 1, held past half the hold time, then
served), then a failed load, a crashed engine and a refused placement. At the end every
panel query returns data. Waits are on conditions, never on sleeps.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.chart._render import render
from tests.observability._queries import Query, rendered_queries
from tests.support import loopback
from tests.support.gateway_fixtures import GatewayProcess, PodProcess
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
                "bundles": {"sglang": {"minReplicas": 0, "maxReplicas": 2}},
            },
            "cold": {
                "enabled": True,
                "machineProfile": "cold",
                "gpuType": "l4",
                "gpu": {"count": 1},
                "bundles": {"sglang": {"minReplicas": 0, "maxReplicas": 2}},
            },
        }
    },
    "models": {},
    "gateway": {"holdSec": 10},
    "serviceMonitor": {"enabled": True, "interval": "1s", "scrapeTimeout": "900ms"},
    "autoscaling": {"enabled": True},
    "metrics": {
        "prometheusRule": {
            "enabled": True,
            "alerts": {
                "engineRequestsWaiting": {"threshold": 0},
                "engineKvCacheFull": {"threshold": 0.9},
            },
        },
        "dashboards": {"enabled": True},
    },
}
WARM = "sie-sie-workers-warm-sglang"
COLD = "sie-sie-workers-cold-sglang"
STREAM = {
    "prompt": "a b",
    "max_tokens": 20,
    "stream": True,
    "fake": {"tokens": 400, "token_delay_s": 0.25},
}


def _total(result: list[dict[str, Any]]) -> float | None:
    return sum(float(r["value"][1]) for r in result) if result else None


def _by(result: list[dict[str, Any]], *labels: str) -> dict[tuple[str, ...], float]:
    return {tuple(r["metric"].get(k, "") for k in labels): float(r["value"][1]) for r in result}


class Checks:
    """The rendered queries by key, evaluated on ``prometheus``; remembers which were checked."""

    def __init__(self, prometheus: PrometheusProcess, queries: list[Query]) -> None:
        self.prometheus = prometheus
        self.queries = {q.key: q for q in queries}
        self.checked: set[str] = set()

    def wait(
        self, key: str, predicate: Callable[[list[dict[str, Any]]], bool], what: str
    ) -> list[dict[str, Any]]:
        self.checked.add(key)
        promql = self.queries[key].promql()
        return self.prometheus.wait_for(promql, predicate, what=f"{key}: {what}")

    def total(self, key: str, expected: float | None) -> None:
        self.wait(key, lambda r: _total(r) == expected, f"total {expected}")

    def alert(
        self, name: str, expected: Mapping[tuple[str, ...], float | None], *labels: str
    ) -> None:
        """The alert's expression returns exactly these label values (a value of None: any)."""

        def holds(result: list[dict[str, Any]]) -> bool:
            got = _by(result, *labels)
            return set(got) == set(expected) and all(
                v is None or got[k] == v for k, v in expected.items()
            )

        self.wait(name, holds, f"returns {dict(expected)} by {labels}")


def _values_file(tmp_path: Path) -> Path:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(VALUES))
    return path


def _gateway_env(docs: list[dict[str, Any]], name: str) -> str:
    deployment = next(
        d
        for d in docs
        if d["kind"] == "Deployment"
        and d["metadata"]["labels"].get("app.kubernetes.io/component") == "gateway"
    )
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    return str(next(e["value"] for e in env if e["name"] == name))


def _targets(
    release: str,
    r1: PodProcess,
    r2: PodProcess,
    w0: WorkerProcess,
    w1: WorkerProcess,
    gw: GatewayProcess,
) -> Callable[[Mapping[str, Any], str], list[Target]]:
    def where(deployment: Mapping[str, Any], port: str) -> list[Target]:
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        pool = labels.get("sie-workers/pool")
        address = {
            (None, "http"): gw.url,
            ("warm", "http"): r1.url,
            ("warm", "worker-0"): w0.url,
            ("warm", "worker-1"): w1.url,
            ("cold", "http"): r2.url,
            # cold's worker-0 is W1, already scraped as warm's worker-1.
        }.get((pool, port))
        if address is None:
            return []
        return [Target(address.removeprefix("http://"), f"{release}-{pool or 'gateway'}-0")]

    return where


@contextlib.contextmanager
def _streams(gateway: GatewayProcess, models: list[str]) -> Iterator[None]:
    """Streams open through the gateway (each past its first event) until the block ends."""
    with contextlib.ExitStack() as stack:
        readers = []  # a dropped line iterator would close its stream
        for model in models:
            client = stack.enter_context(gateway.client(headers={"X-SIE-Pool": "warm"}))
            response = stack.enter_context(
                client.stream("POST", "/v1/completions", json={"model": model, **STREAM})
            )
            assert response.status_code == 200, response.read()
            readers.append(response.iter_lines())
            next(readers[-1])
        yield


def _post(gateway: GatewayProcess, pool: str, model: str) -> Callable[[], httpx.Response]:
    def post() -> httpx.Response:
        body = {"model": model, "prompt": "x", "max_tokens": 2}
        with gateway.client(headers={"X-SIE-Pool": pool}) as client:
            return client.post("/v1/completions", json=body)

    return post


def _answers(url: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return loopback.get(url, timeout=2).status_code == 200
    return False


def _in_background(
    call: Callable[[], httpx.Response],
) -> tuple[threading.Thread, list[httpx.Response | Exception]]:
    """``call`` in a thread; its answer (or the exception it raised) lands in the list."""
    answers: list[httpx.Response | Exception] = []

    def run() -> None:
        try:
            answers.append(call())
        except Exception as exc:  # reported by the test's assertion on the answers
            answers.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, answers


def _statuses(answers: list[httpx.Response | Exception]) -> list[int | str]:
    return [a.status_code if isinstance(a, httpx.Response) else repr(a) for a in answers]


def test_every_rendered_query_returns_what_the_scenario_implies(
    tmp_path: Path,
    start_worker: Callable[..., WorkerProcess],
    start_pod: Callable[..., PodProcess],
    start_gateway: Callable[..., GatewayProcess],
    start_prometheus: Callable[..., PrometheusProcess],
) -> None:
    values = _values_file(tmp_path)
    docs = render(values)
    other = render(values, release="other")
    queries = rendered_queries(docs)
    slow_ready, pinned_ready = tmp_path / "slow-ready", tmp_path / "pinned-ready"

    w0 = start_worker(
        [
            # vLLM's series for one engine, SGLang's for the others: the engine panels and
            # alerts read both.
            fake_model("org/gen", env={"FAKE_ENGINE_METRICS": "vllm"}),
            fake_model(
                "org/queue", env={"FAKE_ENGINE_MAX_RUNNING": "1", "FAKE_ENGINE_KV_TOKENS": "40"}
            ),
            fake_model(
                "org/slow", env={"FAKE_ENGINE_READY_FILE": str(slow_ready)}, startup_timeout_s=240
            ),
            fake_model("org/broken", env={"FAKE_ENGINE_EXIT_AT_START": "3"}),
            fake_model("org/crashy", env={"FAKE_ENGINE_CRASH_AFTER_S": "0.5"}),
        ],
        devices="cuda:0,cuda:1",
        # Pinned from the start, so the router never sees them evictable: with nothing to
        # evict and a load under way (W1's), it queues a request for a third model.
        env={"SIE_PINNED_MODELS": "org/gen,org/queue"},
    )
    w1 = start_worker(
        [
            fake_model("org/pinned", env={"FAKE_ENGINE_READY_FILE": str(pinned_ready)}),
            fake_model("org/gen"),
        ],
        devices="cuda:0",
        # Device memory for the memory panel: 80 GiB holds one model of the default 0.85.
        env={"SIE_PINNED_MODELS": "org/pinned", "SIE_FAKE_MEMORY_BUDGET": "80GiB"},
    )
    r1 = start_pod([], workers=[w0, w1], wait=False)
    r2 = start_pod([], workers=[w1], wait=False)
    wait_until(lambda: _answers(r1.url + "/readyz"), timeout=60)
    pools = [
        {
            "pool": p,
            "bundle": "sglang",
            "machine_profile": p,
            "gpu_type": "l4",
            "slots": n,
            "slot_width": 1,
            "endpoints": [pod.url],
        }
        for p, n, pod in (("warm", 2, r1), ("cold", 1, r2))
    ]
    hold_s = _gateway_env(docs, "SIE_GATEWAY_HOLD_S")
    gateway = start_gateway(pools, env={"SIE_GATEWAY_HOLD_S": hold_s})
    jobs = [
        job
        for release, render_docs in (("sie", docs), ("other", other))
        for job in service_monitor_jobs(
            render_docs, _targets(release, r1, r2, w0, w1, gateway), interval="1s", timeout="900ms"
        )
    ]
    prometheus = start_prometheus(jobs)
    prometheus.wait_for(
        "count(up == 1)", lambda r: _total(r) == 10.0, timeout=60, what="10 targets up"
    )
    checks = Checks(prometheus, queries)

    # --- a slow pinned load on W1 (slot 1 not ready), 3 streams, a request queued ------------
    with _streams(gateway, ["org/gen", "org/queue", "org/queue"]):
        slow, slow_answers = _in_background(_post(gateway, "warm", "org/slow"))
        checks.total(f"{WARM}/inflight", 3.0)
        # The gateway has relayed the queued request too: 3 streams + 1 waiting in the pod.
        checks.total(f"{WARM}/gateway-inflight", 4.0)
        checks.total(f"{WARM}/queued", 1.0)
        checks.total(f"{WARM}/loading", 1.0)
        checks.total(f"{WARM}/pending", 0.0)
        checks.total(f"{COLD}/pending", 0.0)
        checks.total(f"{COLD}/gateway-inflight", 0.0)
        checks.total(f"{COLD}/inflight", 0.0)
        checks.total(f"{COLD}/queued", 0.0)
        checks.total(f"{COLD}/loading", None)  # no worker of the cold pod is scraped
        # W1 is warm's slot 1 and cold's slot 0.
        checks.alert("SieWorkerNotReady", {("warm", "1"): 0.0, ("cold", "0"): 0.0}, "pool", "slot")
        checks.alert("SieRequestsQueueing", {("warm", "sie-warm-0"): 1.0}, "pool", "pod")
        checks.alert(
            "SieEngineRequestsWaiting", {("org/queue", "worker-0"): 1.0}, "model", "container"
        )
        checks.alert("SieEngineKvCacheFull", {("org/queue",): 1.0}, "model")
        for name in (
            "SieModelLoadFailed",
            "SiePlacementFailed",
            "SieEngineRestarts",
            "SieGatewayHoldTooLong",
        ):
            checks.alert(name, {}, "pool")
        checks.wait(
            "sie-worker/In flight/A",
            lambda r: _by(r, "model") == {("org/gen",): 1.0, ("org/queue",): 2.0},
            "1 + 2",
        )
        checks.wait(
            "sie-worker/Engine: waiting and running requests/A",
            lambda r: _by(r, "model") == {("org/gen",): 0.0, ("org/queue",): 1.0},
            "org/queue waits 1",
        )
        checks.wait(
            "sie-worker/Engine: waiting and running requests/B",
            lambda r: _by(r, "model") == {("org/gen",): 1.0, ("org/queue",): 1.0},
            "one running each",
        )
        checks.wait(
            "sie-fleet/In-flight requests/A",
            lambda r: _by(r, "pool") == {("warm",): 3.0, ("cold",): 0.0},
            "warm 3",
        )
        checks.wait(
            "sie-fleet/Queued requests/A",
            lambda r: _by(r, "pool") == {("warm",): 1.0, ("cold",): 0.0},
            "warm 1",
        )
        checks.wait(
            "sie-gateway/In flight/A",
            lambda r: _by(r, "pool") == {("warm",): 4.0, ("cold",): 0.0},
            "warm 4: the queued one too",
        )

    # --- unpinned, org/gen makes room: the queued request's model loads slowly, then serves --
    with w0.client() as client:
        assert client.post("/v1/models/org/gen/unpin").status_code == 200
    checks.total(f"{WARM}/loading", 2.0)
    checks.total(f"{WARM}/inflight", 1.0)
    checks.total(f"{WARM}/queued", 1.0)  # sent to W0, waiting there for its model to load
    slow_ready.touch()
    slow.join(60)
    assert _statuses(slow_answers) == [200]
    checks.total(f"{WARM}/inflight", 0.0)
    checks.total(f"{WARM}/queued", 0.0)
    checks.total(f"{WARM}/loading", 1.0)
    checks.alert("SieRequestsQueueing", {}, "pool")

    # --- a request held at the cold pool until W1's pinned load ends -------------------------
    held, held_answers = _in_background(_post(gateway, "cold", "org/pinned"))
    checks.total(f"{COLD}/pending", 1.0)
    checks.wait(
        "sie-fleet/Held requests/A",
        lambda r: _by(r, "pool") == {("cold",): 1.0, ("warm",): 0.0},
        "cold 1",
    )
    checks.alert("SieGatewayHoldTooLong", {("cold",): None}, "pool")
    pinned_ready.touch()
    held.join(60)
    assert _statuses(held_answers) == [200]
    checks.total(f"{COLD}/pending", 0.0)
    checks.total(f"{WARM}/loading", 0.0)
    checks.alert("SieGatewayHoldTooLong", {}, "pool")
    checks.alert("SieWorkerNotReady", {}, "pool")

    # --- a failed load, a crashed engine, a refused placement --------------------------------
    with w0.client() as client:
        assert client.post("/v1/models/org/broken/load").status_code == 502
        assert client.post("/v1/models/org/crashy/load").status_code == 200
        wait_until(lambda: w0.models()["org/crashy"]["state"] == "failed", timeout=30)
    with w1.client() as client:
        assert client.post("/v1/models/org/gen/load").status_code == 409
    checks.alert("SieModelLoadFailed", {("worker-0", "load_failed"): None}, "container", "outcome")
    checks.alert("SieEngineRestarts", {("worker-0",): None}, "container")
    checks.alert("SiePlacementFailed", {("worker-1",): None}, "container")

    # --- device memory: a device near its budget is its own test (below); here, whatever the
    # worker exports, the alert returns exactly the devices above the threshold.
    ratio = prometheus.query(
        'sie_device_memory_reserved_bytes{release="sie"}'
        ' / sie_device_memory_total_bytes{release="sie"} > 0.9'
    )
    checks.alert("SieDeviceMemoryNearBudget", dict.fromkeys(_by(ratio, "device")), "device")

    # --- after the traffic, every panel query returns data ---------------------------------
    for query in queries:
        if query.kind != "panel":
            continue
        checks.wait(query.key, bool, "returns data")
    unchecked = sorted(set(checks.queries) - checks.checked)
    assert unchecked == [], f"rendered queries no scenario checked: {unchecked}"


def test_the_device_memory_alert_fires_for_a_device_near_its_budget(
    tmp_path: Path,
    start_worker: Callable[..., WorkerProcess],
    start_prometheus: Callable[..., PrometheusProcess],
) -> None:
    docs = render(_values_file(tmp_path))
    alert = next(q for q in rendered_queries(docs) if q.key == "SieDeviceMemoryNearBudget")
    # 0.9 x 80 GiB + 1 GiB reserved of 80 GiB on cuda:0 (DESIGN.md, "Device memory").
    worker = start_worker(
        [fake_model("org/big", mem_fraction_static=0.9), fake_model("org/small")],
        devices="cuda:0,cuda:1",
        env={"SIE_FAKE_MEMORY_BUDGET": "80GiB"},
    )
    pod = {"sie-workers/pool": "warm", "port": "worker-0"}

    def where(deployment: Mapping[str, Any], port: str) -> list[Target]:
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        if (labels.get(next(iter(pod))), port) != ("warm", pod["port"]):
            return []
        return [Target(worker.url.removeprefix("http://"), "sie-warm-0")]

    prometheus = start_prometheus(service_monitor_jobs(docs, where, interval="1s", timeout="900ms"))
    prometheus.wait_for(alert.promql(), lambda r: r == [], what="nothing placed yet")
    with worker.client() as client:
        assert client.post("/v1/models/org/small/load").status_code == 200
        assert client.post("/v1/models/org/big/load").status_code == 200
    devices = {r["metric"]["device"] for r in prometheus.wait_for(alert.promql(), bool)}
    big = worker.models()["org/big"]["devices"]
    assert devices == set(big)
