"""A local Kubernetes control plane for tests/cluster, from the binaries of scripts/cluster-setup.

etcd, kube-apiserver, kube-scheduler, kube-controller-manager and kwok run as plain
processes bound to 127.0.0.1. There are no kubelets: kwok manages the Nodes annotated
``kwok.x-k8s.io/node: fake`` (heartbeats, leases) and moves the pods bound to them through
its lifecycle stages, so the real scheduler places pods on simulated GPU nodes and they go
Running. The API server serves TLS from a generated CA, authorizes with RBAC, and the
admin kubeconfig holds a client certificate in ``system:masters``.

Command line (what scripts/cluster-up and scripts/cluster-down run):

    python -m tests.cluster.controlplane up [--dir DIR]     # prints export KUBECONFIG=...
    python -m tests.cluster.controlplane down --dir DIR
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import ctypes
import http.client
import json
import os
import secrets
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol

from tests.support.ports import free_ports

__all__ = [
    "COMPONENTS",
    "REPO",
    "ControlPlane",
    "ControlPlaneError",
    "Paths",
    "Ports",
    "component_argv",
    "default_tools_dir",
    "main",
    "stop_detached",
]

REPO = Path(__file__).resolve().parents[2]
#: Start order; teardown runs in reverse.
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
#: The annotation kwok selects the nodes it simulates by.
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node=fake"
_SERVICE_CIDR = "10.96.0.0/16"
_SERVICE_IP = "10.96.0.1"
_STATE_FILE = "state.json"


class ControlPlaneError(RuntimeError):
    """The control plane could not start, or one of its processes died."""


class _Process(Protocol):
    """What stop() needs of a process: a Popen, or one adopted by pid from another `up`."""

    @property
    def pid(self) -> int: ...
    def poll(self) -> int | None: ...
    def send_signal(self, sig: int, /) -> None: ...
    def kill(self) -> None: ...
    def wait(self, timeout: float) -> int: ...


def default_tools_dir() -> Path:
    """Where scripts/cluster-setup puts its outputs (``SIE_CLUSTER_TOOLS`` overrides)."""
    env = os.environ.get("SIE_CLUSTER_TOOLS")
    if env:
        return Path(env)
    return REPO / ".tools" / "cluster"


@dataclass(frozen=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int

    @classmethod
    def pick(cls) -> Ports:
        return cls(*free_ports(5))


@dataclass(frozen=True)
class Paths:
    """Every file the control plane reads or writes, under one work directory."""

    workdir: Path
    tools: Path

    def bin(self, name: str) -> Path:
        return self.tools / "bin" / name

    @property
    def pki(self) -> Path:
        return self.workdir / "pki"

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig"

    @property
    def etcd_data(self) -> Path:
        return self.workdir / "etcd"

    @property
    def kwok_stages(self) -> Path:
        return self.tools / "kwok" / "stages.yaml"

    def log(self, name: str) -> Path:
        return self.workdir / "logs" / f"{name}.log"

    def cert_dir(self, name: str) -> Path:
        return self.workdir / "serving" / name


def component_argv(name: str, paths: Paths, ports: Ports) -> list[str]:
    """The command line of one component (pure, so the flags are readable in one place)."""
    pki = paths.pki
    kubeconfig = str(paths.kubeconfig)
    if name == "etcd":
        peer = f"http://127.0.0.1:{ports.etcd_peer}"
        client = f"http://127.0.0.1:{ports.etcd_client}"
        return [
            str(paths.bin("etcd")),
            "--name=sie",
            f"--data-dir={paths.etcd_data}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=sie={peer}",
            # Throwaway test data: skipping fsync makes every API write several times faster.
            "--unsafe-no-fsync",
            "--quota-backend-bytes=1073741824",
            "--log-level=warn",
        ]
    if name == "kube-apiserver":
        return [
            str(paths.bin("kube-apiserver")),
            f"--etcd-servers=http://127.0.0.1:{ports.etcd_client}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={ports.apiserver}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--cert-dir={paths.cert_dir('kube-apiserver')}",
            "--authorization-mode=RBAC",
            "--allow-privileged=true",
            f"--service-cluster-ip-range={_SERVICE_CIDR}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--profiling=false",
        ]
    if name == "kube-controller-manager":
        return [
            str(paths.bin("kube-controller-manager")),
            f"--kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports.controller_manager}",
            f"--cert-dir={paths.cert_dir('kube-controller-manager')}",
            "--leader-elect=false",
            f"--root-ca-file={pki / 'ca.crt'}",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            # One client shared by all controllers: no per-controller service accounts to wait for.
            "--use-service-account-credentials=false",
            "--kube-api-qps=500",
            "--kube-api-burst=1000",
            "--profiling=false",
        ]
    if name == "kube-scheduler":
        return [
            str(paths.bin("kube-scheduler")),
            f"--kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports.scheduler}",
            f"--cert-dir={paths.cert_dir('kube-scheduler')}",
            "--leader-elect=false",
            "--kube-api-qps=500",
            "--kube-api-burst=1000",
            "--profiling=false",
        ]
    if name == "kwok":
        return [
            str(paths.bin("kwok")),
            f"--kubeconfig={kubeconfig}",
            f"--config={paths.kwok_stages}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}",
            "--node-ip=127.0.0.1",
            # Leases keep simulated nodes Ready without rewriting their status every few seconds.
            "--node-lease-duration-seconds=40",
        ]
    raise ValueError(f"unknown component {name!r}; expected one of {', '.join(COMPONENTS)}")


# -- certificates -------------------------------------------------------------------------

_OPENSSL_CONFIG = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = unused
[v3_ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign, digitalSignature
subjectKeyIdentifier = hash
[v3_server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = {sans}
[v3_client]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = clientAuth
"""


def _openssl(*args: str) -> None:
    try:
        subprocess.run(["openssl", *args], check=True, capture_output=True, text=True)
    except FileNotFoundError as exc:
        raise ControlPlaneError(
            "openssl is not on PATH; install it (apt-get install openssl)"
        ) from exc
    except subprocess.CalledProcessError as exc:
        raise ControlPlaneError(f"openssl {args[0]} failed: {exc.stderr.strip()}") from exc


def _write_pki(pki: Path) -> None:
    """A CA, the API server's serving cert, an admin client cert and the service-account key."""
    pki.mkdir(parents=True, exist_ok=True)
    sans = "IP:127.0.0.1, DNS:localhost, DNS:kubernetes, DNS:kubernetes.default, "
    sans += (
        f"DNS:kubernetes.default.svc, DNS:kubernetes.default.svc.cluster.local, IP:{_SERVICE_IP}"
    )
    cnf = pki / "openssl.cnf"
    cnf.write_text(_OPENSSL_CONFIG.format(sans=sans))
    for key in ("ca", "apiserver", "admin", "sa"):
        # EC P-256: generated in milliseconds, accepted for TLS and service-account tokens.
        _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
                 "-out", str(pki / f"{key}.key"))  # fmt: skip
    _openssl("req", "-x509", "-new", "-config", str(cnf), "-extensions", "v3_ca",
             "-key", str(pki / "ca.key"), "-subj", "/CN=sie-cluster-ca", "-days", "30",
             "-out", str(pki / "ca.crt"))  # fmt: skip
    _openssl("pkey", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))
    for name, subject, ext in (
        ("apiserver", "/CN=kube-apiserver", "v3_server"),
        ("admin", "/O=system:masters/CN=sie-admin", "v3_client"),
    ):
        csr = pki / f"{name}.csr"
        _openssl("req", "-new", "-config", str(cnf), "-key", str(pki / f"{name}.key"),
                 "-subj", subject, "-out", str(csr))  # fmt: skip
        _openssl("x509", "-req", "-in", str(csr), "-CA", str(pki / "ca.crt"),
                 "-CAkey", str(pki / "ca.key"), "-set_serial", str(secrets.randbits(63)),
                 "-days", "30", "-extfile", str(cnf), "-extensions", ext,
                 "-out", str(pki / f"{name}.crt"))  # fmt: skip


def _kubeconfig(pki: Path, server: str) -> str:
    def b64(name: str) -> str:
        return base64.b64encode((pki / name).read_bytes()).decode()

    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "sie",
                "cluster": {"server": server, "certificate-authority-data": b64("ca.crt")},
            }
        ],
        "users": [
            {
                "name": "sie-admin",
                "user": {
                    "client-certificate-data": b64("admin.crt"),
                    "client-key-data": b64("admin.key"),
                },
            }
        ],
        "contexts": [{"name": "sie", "context": {"cluster": "sie", "user": "sie-admin"}}],
        "current-context": "sie",
    }
    return json.dumps(doc, indent=2)  # JSON is YAML; kubectl and helm read it as is.


# -- processes ----------------------------------------------------------------------------


def _die_with_parent() -> None:
    # PR_SET_PDEATHSIG: if pytest is killed outright, the kernel still stops the component.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM, 0, 0, 0)


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:])


def _pid_is(pid: int, binary: Path) -> bool:
    """Whether ``pid`` still runs ``binary`` (so a reused pid is never signalled)."""
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0]
    except OSError:
        return False
    return argv0 == str(binary).encode()


@dataclass
class ControlPlane:
    """One control plane: ``start()`` returns once the API is ready, ``stop()`` ends it all."""

    workdir: Path
    tools: Path = field(default_factory=default_tools_dir)
    ports: Ports = field(default_factory=Ports.pick)
    detach: bool = False  # True for `up`: processes outlive this Python process
    _procs: dict[str, _Process] = field(default_factory=dict, init=False)

    @property
    def paths(self) -> Paths:
        return Paths(self.workdir, self.tools)

    @property
    def kubeconfig(self) -> Path:
        return self.paths.kubeconfig

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    def start(self, timeout: float = 120.0) -> None:
        missing = [n for n in COMPONENTS if not os.access(self.paths.bin(n), os.X_OK)]
        if not self.paths.kwok_stages.is_file():
            missing.append(str(self.paths.kwok_stages.relative_to(self.tools)))
        if missing:
            raise ControlPlaneError(
                f"missing under {self.tools}: {', '.join(missing)}; run scripts/cluster-setup"
            )
        deadline = time.monotonic() + timeout
        try:
            self.workdir.mkdir(parents=True, exist_ok=True)
            (self.workdir / "logs").mkdir(exist_ok=True)
            _write_pki(self.paths.pki)
            self.kubeconfig.write_text(_kubeconfig(self.paths.pki, self.server))
            self._spawn("etcd")
            self._wait(deadline, "etcd", self._etcd_healthy)
            # The rest retry until the API server answers, so they start together.
            for name in COMPONENTS[1:]:
                self._spawn(name)
            self._save_state()
            self._wait(deadline, "kube-apiserver", lambda: self._api_get("/readyz") == 200)
            self._wait(deadline, "kube-controller-manager", self._controllers_running)
            self._wait(deadline, "kube-scheduler", lambda: self._healthz(self.ports.scheduler))
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM every component (newest first), SIGKILL what is left after ``timeout``."""
        _stop_all(self._procs, timeout)
        self._procs = {}
        with contextlib.suppress(FileNotFoundError):
            (self.workdir / _STATE_FILE).unlink()

    def check_alive(self) -> None:
        """Raise, naming the component and its log, when any process has exited."""
        for name, proc in self._procs.items():
            code = proc.poll()
            if code is not None:
                log = self.paths.log(name)
                raise ControlPlaneError(f"{name} exited with {code}; {log}:\n{_tail(log)}")

    # -- internals ----------------------------------------------------------------------

    def _spawn(self, name: str) -> None:
        argv = component_argv(name, self.paths, self.ports)
        with self.paths.log(name).open("ab") as log:
            self._procs[name] = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                start_new_session=True,
                preexec_fn=None if self.detach else _die_with_parent,
            )

    def _wait(self, deadline: float, name: str, ready: Callable[[], bool]) -> None:
        while True:
            self.check_alive()
            with contextlib.suppress(OSError, http.client.HTTPException):
                if ready():
                    return
            if time.monotonic() > deadline:
                log = self.paths.log(name)
                raise ControlPlaneError(f"{name} not ready in time; {log}:\n{_tail(log)}")
            time.sleep(0.1)

    def _etcd_healthy(self) -> bool:
        conn = http.client.HTTPConnection("127.0.0.1", self.ports.etcd_client, timeout=2)
        try:
            conn.request("GET", "/health")
            resp = conn.getresponse()
            return resp.status == 200 and b'"true"' in resp.read()
        finally:
            conn.close()

    def _api_context(self) -> ssl.SSLContext:
        pki = self.paths.pki
        ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        return ctx

    def _api_get(self, path: str) -> int:
        conn = http.client.HTTPSConnection(
            "127.0.0.1", self.ports.apiserver, context=self._api_context(), timeout=5
        )
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            resp.read()
            return resp.status
        finally:
            conn.close()

    def _controllers_running(self) -> bool:
        # The service-account controller creating `default` proves the controllers sync.
        status = self._api_get("/api/v1/namespaces/default/serviceaccounts/default")
        return status == 200 and self._healthz(self.ports.controller_manager)

    @staticmethod
    def _healthz(port: int) -> bool:
        # Self-signed serving certs; /healthz is readable anonymously.
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=2)
        try:
            conn.request("GET", "/healthz")
            resp = conn.getresponse()
            resp.read()
            return resp.status == 200
        finally:
            conn.close()

    def _save_state(self) -> None:
        state = {
            "tools": str(self.tools),
            "ports": self.ports.__dict__,
            "pids": {name: proc.pid for name, proc in self._procs.items()},
        }
        (self.workdir / _STATE_FILE).write_text(json.dumps(state, indent=2))


class _Adopted:
    """A component started by another `up`, known by pid and checked against its binary."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._binary = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0]

    def poll(self) -> int | None:
        alive = _pid_is(self.pid, Path(self._binary.decode()))
        return None if alive else 0

    def send_signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while self.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        return 0


def _reap(proc: _Process, deadline: float) -> None:
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)


def _stop_all(procs: Mapping[str, _Process], timeout: float) -> None:
    """SIGTERM every component (newest first), SIGKILL what is left after ``timeout``."""
    # Controllers started beside the control plane (the LWS controller of `up --lws`) first.
    extras = [name for name in procs if name not in COMPONENTS]
    for name in [*extras, *reversed(COMPONENTS)]:
        proc = procs.get(name)
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            if name in ("kube-apiserver", "etcd"):
                # etcd goes last, after the API server has closed its connections.
                _reap(proc, time.monotonic() + timeout)
    for proc in procs.values():
        _reap(proc, time.monotonic() + timeout)


def stop_detached(workdir: Path, timeout: float = 15.0) -> list[str]:
    """Stop the components an `up` left running in ``workdir``; returns their names."""
    try:
        state = json.loads((workdir / _STATE_FILE).read_text())
    except FileNotFoundError:
        return []
    tools = Path(state["tools"])
    procs: dict[str, _Process] = {
        name: _Adopted(pid)
        for name, pid in state["pids"].items()
        if _pid_is(pid, tools / "bin" / name)
    }
    _stop_all(procs, timeout)
    (workdir / _STATE_FILE).unlink()
    return sorted(procs)


def _start_lws(plane: ControlPlane) -> None:
    """The LeaderWorkerSet controller beside a detached control plane, stopped with it."""
    # Imported here: both modules import this one.
    from tests.cluster.kube import Kube
    from tests.cluster.lws import LwsController

    tools = REPO / ".tools" / "bin"
    kube = Kube(plane.kubeconfig, tools / "kubectl", tools / "helm", plane.workdir / "helm")
    controller = LwsController(kube, plane.workdir / "lws", plane.tools, detach=True)
    controller.start()
    assert controller.process is not None
    plane._procs["lws"] = controller.process
    plane._save_state()


def main(argv: Sequence[str] | None = None, out: IO[str] = sys.stdout) -> int:
    parser = argparse.ArgumentParser(prog="cluster", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the control plane and leave it running")
    up.add_argument("--dir", type=Path, help="work directory (default: a new temp dir)")
    up.add_argument(
        "--lws",
        action="store_true",
        help="also run the LeaderWorkerSet controller and its webhooks (groups of nodes)",
    )
    down = sub.add_parser("down", help="stop the control plane started in --dir")
    down.add_argument("--dir", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "up":
        workdir = args.dir or Path(tempfile.mkdtemp(prefix="sie-cluster-"))
        plane = ControlPlane(workdir.resolve(), detach=True)
        start = time.monotonic()
        try:
            plane.start()
            if args.lws:
                _start_lws(plane)
        except ControlPlaneError as exc:
            plane.stop()
            print(f"cluster up: {exc}", file=sys.stderr)
            return 1
        print(
            f"# control plane ready in {time.monotonic() - start:.1f}s; logs in {workdir}/logs",
            file=out,
        )
        print(f"export KUBECONFIG={plane.kubeconfig}", file=out)
        print(f"# stop with: scripts/cluster-down --dir {workdir}", file=out)
        return 0
    stopped = stop_detached(args.dir.resolve())
    print(f"# stopped: {', '.join(stopped) or 'nothing was running'}", file=out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
