"""A real Prometheus for tests, and scrape configs that label targets as the chart's
ServiceMonitors would.

``start_prometheus(scrape_configs)`` runs ``.tools/bin/prometheus`` (scripts/setup-tools) on a
free 127.0.0.1 port with its own data folder under the test's tmp_path, and returns a
:class:`PrometheusProcess` once it answers; it is stopped at the end of the test.

:func:`service_monitor_jobs` turns a render's ServiceMonitors into static scrape jobs the way
the Prometheus Operator turns them into Kubernetes ones: the target metadata a pod of the
rendered Deployment would have (``__meta_kubernetes_namespace``, ``..._pod_name``,
``..._pod_container_name``, ``..._service_name``, ``..._pod_label_<name>`` for each label of
the pod template), the operator's own relabelings (``namespace``, ``service``, ``pod``,
``container``, ``job``, ``endpoint``), then the endpoint's ``relabelings`` and
``honorLabels`` as rendered. Which process answers for a pod's port is the test's choice.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support import loopback
from tests.support.ci import missing
from tests.support.ports import free_port
from tests.support.repo import ROOT

__all__ = ["PrometheusProcess", "Target", "service_monitor_jobs", "start_prometheus", "tool"]

# Prometheus Operator relabeling keys -> Prometheus' (camelCase -> snake_case).
_RELABEL_KEYS = {
    "sourceLabels": "source_labels",
    "targetLabel": "target_label",
    "separator": "separator",
    "regex": "regex",
    "modulus": "modulus",
    "replacement": "replacement",
    "action": "action",
}


@dataclass(frozen=True)
class Target:
    """Where a rendered pod's port answers here: ``host:port``, and the pod's name."""

    address: str
    pod: str


@dataclass
class PrometheusProcess:
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result vector; fails the test on a query error."""
        response = loopback.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        body = response.json()
        if body.get("status") != "success":
            pytest.fail(f"query failed: {expr}\n{body}", pytrace=False)
        if body["data"]["resultType"] != "vector":
            pytest.fail(f"not a vector: {expr}: {body['data']}", pytrace=False)
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def wait_for(
        self,
        expr: str,
        predicate: Callable[[list[dict[str, Any]]], bool],
        *,
        timeout: float = 30.0,
        what: str = "",
    ) -> list[dict[str, Any]]:
        """Query ``expr`` until ``predicate`` holds for its result; fail with the last one."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if predicate(result):
                return result
            if time.monotonic() > deadline:
                pytest.fail(
                    f"{what or 'condition'} not met within {timeout}s: {expr}\nlast: {result}",
                    pytrace=False,
                )
            time.sleep(0.2)

    def targets(self) -> list[dict[str, Any]]:
        response = loopback.get(f"{self.url}/api/v1/targets", timeout=10)
        active: list[dict[str, Any]] = response.json()["data"]["activeTargets"]
        return active


def tool(name: str) -> str:
    """The path of ``prometheus`` or ``promtool`` (``.tools/bin``, else PATH); a missing one
    skips the test, or fails it with ``CI=true``."""
    pinned = ROOT / ".tools" / "bin" / name
    found = str(pinned) if pinned.exists() else shutil.which(name)
    if found is None:
        reason = f"{name} is not installed (scripts/setup-tools builds it into .tools/bin)"
        missing(reason)
    return found


def _pod_label_name(name: str) -> str:
    return "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", name)


def _matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def service_monitor_jobs(
    docs: Sequence[Mapping[str, Any]],
    targets: Callable[[Mapping[str, Any], str], Sequence[Target]],
    *,
    interval: str,
    timeout: str,
) -> list[dict[str, Any]]:
    """Scrape jobs for every endpoint of every rendered ServiceMonitor. ``targets(deployment,
    port name)`` says where the pods of that Deployment answer on that port."""
    services = [d for d in docs if d.get("kind") == "Service"]
    deployments = [d for d in docs if d.get("kind") == "Deployment"]
    jobs = []
    for monitor in (d for d in docs if d.get("kind") == "ServiceMonitor"):
        selector = monitor["spec"]["selector"]["matchLabels"]
        namespace = monitor["metadata"]["namespace"]
        service = next(s for s in services if _matches(selector, s["metadata"]["labels"]))
        pod_selector = service["spec"]["selector"]
        deployment = next(
            d
            for d in deployments
            if _matches(pod_selector, d["spec"]["template"]["metadata"]["labels"])
        )
        template = deployment["spec"]["template"]
        for index, endpoint in enumerate(monitor["spec"]["endpoints"]):
            port_name = endpoint["port"]
            container = next(
                c["name"]
                for c in template["spec"]["containers"]
                if any(p.get("name") == port_name for p in c.get("ports", ()))
            )
            static = []
            for target in targets(deployment, port_name):
                meta = {
                    "__meta_kubernetes_namespace": namespace,
                    "__meta_kubernetes_service_name": service["metadata"]["name"],
                    "__meta_kubernetes_pod_name": target.pod,
                    "__meta_kubernetes_pod_container_name": container,
                    "__meta_kubernetes_endpoint_port_name": port_name,
                    **{
                        _pod_label_name(k): str(v)
                        for k, v in template["metadata"]["labels"].items()
                    },
                }
                static.append({"targets": [target.address], "labels": meta})
            operator = [
                {"source_labels": [f"__meta_kubernetes_{m}"], "target_label": label}
                for m, label in (
                    ("namespace", "namespace"),
                    ("service_name", "service"),
                    ("pod_name", "pod"),
                    ("pod_container_name", "container"),
                    ("service_name", "job"),
                    ("endpoint_port_name", "endpoint"),
                )
            ]
            relabel = [
                {_RELABEL_KEYS[k]: v for k, v in r.items()} for r in endpoint.get("relabelings", ())
            ]
            jobs.append(
                {
                    "job_name": f"serviceMonitor/{namespace}/{monitor['metadata']['name']}/{index}",
                    "scrape_interval": interval,
                    "scrape_timeout": timeout,
                    "metrics_path": endpoint.get("path", "/metrics"),
                    "honor_labels": bool(endpoint.get("honorLabels", False)),
                    "static_configs": static,
                    "relabel_configs": operator + relabel,
                }
            )
    return jobs


@pytest.fixture
def start_prometheus(tmp_path: Path) -> Iterator[Callable[..., PrometheusProcess]]:
    started: list[PrometheusProcess] = []

    def start(
        scrape_configs: Sequence[Mapping[str, Any]], *, evaluation_interval: str = "1s"
    ) -> PrometheusProcess:
        binary = tool("prometheus")
        index = len(started)
        config = tmp_path / f"prometheus-{index}.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "global": {"evaluation_interval": evaluation_interval},
                    "scrape_configs": [dict(c) for c in scrape_configs],
                },
                sort_keys=False,
            )
        )
        log_path = tmp_path / f"prometheus-{index}.log"
        port = free_port()
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={tmp_path / f'prometheus-{index}-data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        prometheus = PrometheusProcess(process, port, log_path)
        started.append(prometheus)
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, f"prometheus exited:\n{prometheus.logs()}"
            with contextlib.suppress(httpx.HTTPError):
                if loopback.get(f"{prometheus.url}/-/ready", timeout=1).status_code == 200:
                    return prometheus
            assert time.monotonic() < deadline, f"prometheus not ready:\n{prometheus.logs()}"
            time.sleep(0.1)

    yield start
    for prometheus in started:
        if prometheus.process.poll() is None:
            prometheus.process.terminate()
            try:
                prometheus.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                prometheus.process.kill()
                prometheus.process.wait()
