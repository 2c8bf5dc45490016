"""Security: the API key, where engines listen, and a Config API that is off.

What the worker does (also reported in the issue note):

- ``SIE_API_KEY``: every endpoint but the probes and metrics answers 401 without the key or
  with a near miss; the comparison is ``hmac.compare_digest`` on the whole header; the key
  never appears in the worker's log, even at debug level, and engines never receive it in
  their environment (an engine that prints its environment cannot leak it into the log);
- engines listen on 127.0.0.1 only, HTTP and rendezvous ports alike: a connection to either
  port from a test host (a network namespace the test makes, joined by a veth pair) to this
  machine's non-loopback address on that link is refused;
- with ``SIE_CONFIG_API=disabled`` every config route is 403 whatever the id, and nothing is
  read or written.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
import subprocess
import sys
from typing import Any

import httpx
import psutil
import pytest
from sie_worker.http import front_door
from sie_worker.http.front_door import FrontDoor
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from tests.reliability._support import Launcher, Worker, assert_clean, stream_events
from tests.support import loopback
from tests.support.worker_fixtures import fake_model

_KEY = "sk-sie-Zq81-secret-4711"


@pytest.fixture(scope="module")
def worker(module_launcher: Launcher) -> Worker:
    configs = [fake_model("org/gen"), fake_model("org/tp2", width=2)]
    return module_launcher.start(configs, api_key=_KEY, args=["--log-level", "debug"])


def test_the_key_is_required_near_misses_fail_and_the_key_never_reaches_logs_or_engines(
    worker: Worker,
) -> None:
    near_misses = [
        "",
        _KEY,  # no scheme
        f"Bearer {_KEY[:-1]}",
        f"Bearer {_KEY}x",
        f"Basic {_KEY}",
        f"Bearer  {_KEY}",
    ]
    with loopback.client(base_url=worker.url, timeout=30) as client:
        for header in near_misses:
            headers = {"Authorization": header} if header else {}
            for method, path in (("GET", "/v1/models"), ("POST", "/v1/completions")):
                response = client.request(method, path, headers=headers, json={"model": "x"})
                assert response.status_code == 401, (header, path)
                assert response.json()["error"]["code"] == "unauthorized"
        assert client.get("/metrics").status_code == 200
    with worker.client() as client:  # the right key: loads, streams, errors all work
        client.post("/v1/models/org/tp2/load").raise_for_status()
        assert (
            client.post("/v1/completions", json={"model": "nope", "prompt": "x"}).status_code == 404
        )
    status, events = stream_events(worker, "org/tp2", tokens=3)
    assert (status, events[-1]) == (200, "[DONE]")
    log = worker.logs()
    assert "DEBUG" in log  # debug logging was on
    assert _KEY not in log
    assert _KEY[4:-4] not in log  # nor any large part of it
    for pid in worker.engine_pids():
        with contextlib.suppress(psutil.NoSuchProcess):
            environment = psutil.Process(pid).environ()
            assert "SIE_API_KEY" not in environment, f"engine {pid} received the key"
            assert _KEY not in environment.values()


def test_the_header_is_compared_in_constant_time_with_a_case_insensitive_scheme(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[Any, Any]] = []
    real = front_door.hmac.compare_digest

    def spy(a: Any, b: Any) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(front_door.hmac, "compare_digest", spy)

    async def ok(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    app = FrontDoor([Route("/v1/models", ok)], max_bytes=1024, api_key=_KEY)
    transport = httpx.ASGITransport(app=app)

    async def call(header: str) -> int:
        async with httpx.AsyncClient(transport=transport, base_url="http://w") as client:
            response = await client.get("/v1/models", headers={"Authorization": header})
            return response.status_code

    assert asyncio.run(call(f"Bearer {_KEY}")) == 200
    assert asyncio.run(call(f"Bearer {_KEY[:-1]}")) == 401
    assert asyncio.run(call(f"bearer {_KEY}")) == 200  # the scheme is case-insensitive
    assert asyncio.run(call(f"Bearer {_KEY.upper()}")) == 401  # the token is not
    assert len(calls) == 4
    assert all(isinstance(a, bytes) and isinstance(b, bytes) for a, b in calls)
    assert calls[1][0].endswith(_KEY[:-1].encode())


class _TestHost:
    """A network namespace of this test's own, joined to this machine by a veth pair.

    Probing from it reaches this machine on a non-loopback address without sending any
    traffic beyond hosts the test made itself.
    """

    def __init__(self) -> None:
        tag = secrets.token_hex(3)
        self.name = f"sie-probe-{tag}"
        self.host_link, self.peer_link = f"siev{tag}h", f"siev{tag}p"
        self.host_ip, self.peer_ip = "10.213.0.1", "10.213.0.2"

    def __enter__(self) -> _TestHost:
        steps = [
            ["ip", "netns", "add", self.name],
            ["ip", "link", "add", self.host_link, "type", "veth", "peer", "name", self.peer_link],
            ["ip", "link", "set", self.peer_link, "netns", self.name],
            ["ip", "addr", "add", f"{self.host_ip}/30", "dev", self.host_link],
            ["ip", "link", "set", self.host_link, "up"],
            *(
                ["ip", "netns", "exec", self.name, *cmd]
                for cmd in (
                    ["ip", "addr", "add", f"{self.peer_ip}/30", "dev", self.peer_link],
                    ["ip", "link", "set", self.peer_link, "up"],
                    ["ip", "link", "set", "lo", "up"],
                )
            ),
        ]
        for step in steps:
            result = subprocess.run(step, capture_output=True, text=True, check=False)
            if result.returncode != 0:
                self.__exit__()
                pytest.skip(
                    f"cannot make a test network namespace ({' '.join(step)}): "
                    f"{result.stderr.strip()}"
                )
        return self

    def __exit__(self, *exc: object) -> None:
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", self.host_link], capture_output=True, check=False)

    def connect(self, port: int) -> str:
        """Connect from the namespace to this machine's side of the link: 'ok' or errno name."""
        probe = (
            "import errno, socket, sys\n"
            "s = socket.socket(); s.settimeout(5)\n"
            "try:\n"
            f"    s.connect(({self.host_ip!r}, {port})); print('ok')\n"
            "except OSError as e:\n"
            "    print(errno.errorcode.get(e.errno, str(e)))\n"
        )
        result = subprocess.run(
            ["ip", "netns", "exec", self.name, sys.executable, "-c", probe],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        return result.stdout.strip() or result.stderr.strip()


def _listening_ports(pids: list[int]) -> dict[int, str]:
    ports: dict[int, str] = {}
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            for conn in psutil.Process(pid).net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    ports[conn.laddr.port] = conn.laddr.ip
    return ports


def test_engines_listen_on_loopback_only_and_refuse_non_loopback_connections(
    worker: Worker,
) -> None:
    with worker.client() as client:
        client.post("/v1/models/org/tp2/load").raise_for_status()
    ports = _listening_ports(worker.engine_pids())
    assert len(ports) >= 2, ports  # the HTTP port and the rendezvous port
    assert set(ports.values()) == {"127.0.0.1"}, ports
    with _TestHost() as host:
        # Control: a listener on every address is reachable from the test host...
        with socket.socket() as control:
            control.bind(("0.0.0.0", 0))
            control.listen()
            assert host.connect(control.getsockname()[1]) == "ok"
        # ...the engines' ports are not.
        for port in ports:
            assert host.connect(port) == "ECONNREFUSED", port
    assert_clean(worker, probe=None)


def test_a_disabled_config_api_refuses_every_config_route_and_touches_no_file(
    launcher: Launcher,
) -> None:
    disabled = launcher.start(
        [fake_model("org/m")], devices="cuda:0", env={"SIE_CONFIG_API": "disabled"}
    )
    before = {p: p.read_bytes() for p in disabled.config_dir.rglob("*") if p.is_file()}
    with disabled.client() as client:
        for sie_id in ("org/m", "org/new", "..%2Fescape", "org/%2e%2e/x"):
            for method in ("GET", "PUT", "DELETE"):
                response = client.request(method, f"/v1/configs/{sie_id}", json=fake_model(sie_id))
                assert response.status_code == 403, (method, sie_id, response.text)
                assert "disabled" in response.json()["error"]["message"]
        assert client.get("/v1/configs").status_code == 403
        assert (
            client.post("/v1/completions", json={"model": "org/m", "prompt": "x"}).status_code
            == 200
        )
    after = {p: p.read_bytes() for p in disabled.config_dir.rglob("*") if p.is_file()}
    assert after == before
