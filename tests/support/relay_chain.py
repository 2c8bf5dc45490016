"""The whole request path on one machine, every hop a real process on 127.0.0.1: a gateway
in front of one pod (a slot router in front of one worker, whose model ``org/m`` runs on the
fake engine), and what each hop counts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil

from tests.support import loopback
from tests.support.gateway_fixtures import GatewayProcess, PodProcess
from tests.support.worker_fixtures import fake_model

MODEL = "org/m"


@dataclass
class Chain:
    gateway: GatewayProcess
    pod: PodProcess

    @property
    def worker_url(self) -> str:
        return self.pod.workers[0].url

    def engine_url(self) -> str:
        worker = psutil.Process(self.pod.workers[0].process.pid)
        for child in worker.children(recursive=True):
            argv = child.cmdline()
            if "--port" in argv and any("fake_engine" in a for a in argv):
                return f"http://127.0.0.1:{argv[argv.index('--port') + 1]}"
        raise AssertionError("the worker has no engine")

    def engine(self) -> dict[str, Any]:
        info: dict[str, Any] = loopback.get(self.engine_url() + "/_fake/info", timeout=10).json()
        return info

    def rss(self) -> dict[str, int]:
        pids = {
            "gateway": self.gateway.process.pid,
            "router": self.pod.router.pid,
            "worker": self.pod.workers[0].process.pid,
        }
        return {name: psutil.Process(pid).memory_info().rss for name, pid in pids.items()}

    def inflight(self) -> dict[str, float]:
        """Every hop's count of requests in flight."""
        return {
            "engine": float(self.engine()["in_flight"]),
            "worker": _metric(self.worker_url, f'sie_inflight_requests{{model="{MODEL}"}}'),
            "router": _metric(self.pod.url, 'sie_router_inflight_requests{slot="0"}'),
            "gateway": _metric(
                self.gateway.url, 'sie_gateway_inflight_requests{bundle="sglang",pool="p"}'
            ),
        }


def _metric(url: str, series: str) -> float:
    for line in loopback.get(url + "/metrics", timeout=5).text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


def start_chain(
    start_pod: Callable[..., PodProcess], start_gateway: Callable[..., GatewayProcess]
) -> Chain:
    """A chain whose model is loaded (``start_pod`` and ``start_gateway`` are the fixtures)."""
    pod = start_pod([fake_model(MODEL)])
    gateway = start_gateway([{"pool": "p", "bundle": "sglang", "gpu_type": "l4",
                              "endpoints": [pod.url]}])  # fmt: skip
    chain = Chain(gateway, pod)
    with loopback.client(base_url=gateway.url, timeout=60) as client:
        load = client.post(f"/v1/models/{MODEL}/load")
        assert load.status_code == 200, load.text
    return chain
