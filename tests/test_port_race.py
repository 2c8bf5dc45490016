"""A server a test starts is the one that answers: another process on its port is noticed.

``free_port()`` hands out a port nothing listens on now; another process may bind it before
the test's server does. That server then exits ("address already in use") while the other
answers the readiness probe. The starters of tests/support check who listens and start
again on a new port.
"""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.netns import NetNamespace
from tests.support import ports
from tests.support.engine_fixtures import start_fake_engine
from tests.support.gateway_fixtures import GatewayProcess, PodProcess
from tests.support.ports import free_port, listens
from tests.support.worker_fixtures import WorkerProcess, fake_model


class _AnswersEverything(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b'{"status": "ok", "slots": []}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def squat(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], int]]:
    """``squat()``: the next ``free_port()`` of the starters hands out a port that a server of
    this process holds (and answers 200 on); returns that port."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _AnswersEverything)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = int(server.server_address[1])
    armed: list[bool] = []

    def next_port(host: str = "127.0.0.1") -> int:
        if armed:
            armed.clear()
            return port
        return free_port(host)

    def arm() -> int:
        armed.append(True)
        return port

    monkeypatch.setattr(ports, "free_port", next_port)  # what start_on_free_port calls
    try:
        yield arm
    finally:
        server.shutdown()
        server.server_close()


def test_a_fake_engine_whose_port_was_taken_starts_again_on_another(
    squat: Callable[[], int], tmp_path: Path
) -> None:
    # The squatter answers /health from the start, as another engine did while this one was
    # still importing SGLang's parser (the minimal parser keeps the test fast: the check is
    # the same).
    taken = squat()
    engine = start_fake_engine(tmp_path, parser="minimal")
    try:
        assert engine.port != taken
        assert listens(engine.pid, engine.port)
        assert engine.info()["argv"] == engine.argv
    finally:
        engine.stop()


def test_a_worker_whose_port_was_taken_starts_again_on_another(
    squat: Callable[[], int], start_worker: Callable[..., WorkerProcess]
) -> None:
    taken = squat()
    worker = start_worker([fake_model("org/m")])
    assert worker.port != taken
    assert listens(worker.process.pid, worker.port)
    assert worker.models()["org/m"]["state"] == "unloaded"


def test_a_router_and_a_gateway_whose_ports_were_taken_start_again_on_others(
    squat: Callable[[], int],
    start_worker: Callable[..., WorkerProcess],
    start_pod: Callable[..., PodProcess],
    start_gateway: Callable[..., GatewayProcess],
) -> None:
    worker = start_worker([fake_model("org/m")])
    taken = squat()
    pod = start_pod([], workers=[worker])
    assert pod.port != taken
    assert listens(pod.router.pid, pod.port)
    taken = squat()
    pools = [{"pool": "p", "bundle": "sglang", "gpu_type": "l4", "endpoints": [pod.url]}]
    gateway = start_gateway(pools)
    assert gateway.port != taken
    assert listens(gateway.process.pid, gateway.port)


def test_listens_sees_only_the_processs_own_listening_socket_on_that_port() -> None:
    with socket.socket() as held, socket.socket() as bound:
        held.bind(("127.0.0.1", 0))
        held.listen()
        bound.bind(("127.0.0.1", 0))  # bound, not listening
        assert listens(os.getpid(), held.getsockname()[1])
        assert not listens(os.getpid(), bound.getsockname()[1])
        other = subprocess.Popen(["sleep", "30"])
        try:
            assert not listens(other.pid, held.getsockname()[1])
        finally:
            other.kill()
            other.wait()
    assert not listens(other.pid, 1)  # gone


def test_listens_sees_a_server_in_a_network_namespace_of_its_own() -> None:
    """A cluster test's gateway runs inside its own namespace (tests/cluster/netns.py)."""
    why = NetNamespace.available()
    if why is not None:
        pytest.skip(f"needs a network namespace: {why}")
    ns = NetNamespace()
    ns.start()
    try:
        port = free_port()
        server = subprocess.Popen(
            [*ns.prefix(), sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 30
            while not listens(server.pid, port):
                assert server.poll() is None
                assert time.monotonic() < deadline, "the server never listened"
                time.sleep(0.05)
            assert not listens(server.pid, port + 1)
        finally:
            server.kill()
            server.wait()
    finally:
        ns.stop()
