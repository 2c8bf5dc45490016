"""The LeaderWorkerSet controller beside the test control plane.

LWS's pod webhook is what gives a group's pods their rank (``LWS_WORKER_INDEX``,
``LWS_GROUP_SIZE``, ``LWS_LEADER_ADDRESS`` and the group/worker labels), so the controller
runs with its webhook server: on 127.0.0.1, with a certificate made here from a CA of its
own, behind webhook configurations whose ``clientConfig.url`` points at it with that CA as
``caBundle`` (no Service, no in-cluster cert manager: internal cert management is off in
its ``--config`` file, leader election off). The CRDs and webhook configurations come from
the same pinned module as the binary (scripts/cluster-setup); the kustomize patches of the
release are applied here, so the pod webhooks see only pods labelled with an LWS name.
It creates StatefulSets; kube-controller-manager makes their pods.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import http.client
import json
import signal
import socket
import ssl
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.controlplane import (
    _OPENSSL_CONFIG,
    ControlPlaneError,
    _die_with_parent,
    _openssl,
    _tail,
)
from tests.cluster.kube import Kube
from tests.support.ports import free_ports

__all__ = [
    "GROUP_INDEX_LABEL",
    "LWS_NAME_LABEL",
    "WORKER_INDEX_LABEL",
    "LwsController",
    "webhook_configurations",
]

LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
#: Prefix of the webhook configurations' names (the release's names are generic).
_WEBHOOK_PREFIX = "sie-test-lws"
_READY_S = 60.0


def webhook_configurations(webhook_dir: Path, url: str, ca_bundle: bytes) -> list[dict[str, Any]]:
    """The release's Mutating/ValidatingWebhookConfigurations, patched as its kustomization
    does, each webhook's ``clientConfig.service`` replaced by ``url`` + its path."""
    docs = [d for d in yaml.safe_load_all((webhook_dir / "manifests.yaml").read_text()) if d]
    patches = {
        "MutatingWebhookConfiguration": webhook_dir / "mutating-patch.yaml",
        "ValidatingWebhookConfiguration": webhook_dir / "validating-patch.yaml",
    }
    out = []
    for doc in docs:
        doc = copy.deepcopy(doc)
        for op in yaml.safe_load(patches[doc["kind"]].read_text()) or []:
            # The release's patches replace whole webhooks; anything else is a new shape.
            head, _, index = op["path"].rpartition("/")
            if op["op"] != "replace" or head != "/webhooks":
                raise ControlPlaneError(f"unexpected LWS webhook patch {op['op']} {op['path']}")
            doc["webhooks"][int(index)] = op["value"]
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {
                "url": url + path,
                "caBundle": base64.b64encode(ca_bundle).decode(),
            }
            hook["timeoutSeconds"] = 10
        doc["metadata"] = {"name": f"{_WEBHOOK_PREFIX}-{doc['metadata']['name']}"}
        out.append(doc)
    return out


def _write_serving_cert(cert_dir: Path) -> bytes:
    """A CA and a serving certificate for 127.0.0.1 (controller-runtime's tls.crt/tls.key)."""
    cert_dir.mkdir(parents=True, exist_ok=True)
    cnf = cert_dir / "openssl.cnf"
    cnf.write_text(_OPENSSL_CONFIG.format(sans="IP:127.0.0.1, DNS:localhost"))
    ec = ("-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256")
    _openssl("genpkey", *ec, "-out", str(cert_dir / "ca.key"))
    _openssl("genpkey", *ec, "-out", str(cert_dir / "tls.key"))
    _openssl("req", "-x509", "-new", "-config", str(cnf), "-extensions", "v3_ca",
             "-key", str(cert_dir / "ca.key"), "-subj", "/CN=sie-lws-webhook-ca", "-days", "30",
             "-out", str(cert_dir / "ca.crt"))  # fmt: skip
    _openssl("req", "-new", "-config", str(cnf), "-key", str(cert_dir / "tls.key"),
             "-subj", "/CN=127.0.0.1", "-out", str(cert_dir / "tls.csr"))  # fmt: skip
    _openssl("x509", "-req", "-in", str(cert_dir / "tls.csr"), "-CA", str(cert_dir / "ca.crt"),
             "-CAkey", str(cert_dir / "ca.key"), "-CAcreateserial", "-days", "30",
             "-extfile", str(cnf), "-extensions", "v3_server",
             "-out", str(cert_dir / "tls.crt"))  # fmt: skip
    return (cert_dir / "ca.crt").read_bytes()


@dataclass
class LwsController:
    """``start()`` installs the CRDs, runs the controller and registers its webhooks once
    they answer; ``stop()`` removes the webhook configurations and ends the process."""

    kube: Kube
    workdir: Path
    tools: Path
    detach: bool = False  # True for `cluster-up --lws`: the process outlives this one
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False)
    _webhooks: list[tuple[str, str]] = field(default_factory=list, init=False)

    @property
    def binary(self) -> Path:
        return self.tools / "bin" / "lws"

    @property
    def crds(self) -> list[Path]:
        return sorted((self.tools / "crds" / "lws").glob("*.yaml"))

    @property
    def webhook_dir(self) -> Path:
        return self.tools / "lws" / "webhook"

    @property
    def process(self) -> subprocess.Popen[bytes] | None:
        return self._proc

    @property
    def log(self) -> Path:
        return self.workdir / "lws.log"

    def start(self, timeout: float = _READY_S) -> None:
        if not self.binary.is_file() or not self.crds or not self.webhook_dir.is_dir():
            raise ControlPlaneError(
                f"the LeaderWorkerSet controller, CRDs or webhook files are missing under "
                f"{self.tools}; run scripts/cluster-setup"
            )
        self.workdir.mkdir(parents=True, exist_ok=True)
        webhook_port, health_port = free_ports(2)
        ca = _write_serving_cert(self.workdir / "certs")
        config = {
            "apiVersion": "config.lws.x-k8s.io/v1alpha1",
            "kind": "Configuration",
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "webhook": {
                "host": "127.0.0.1",
                "port": webhook_port,
                "certDir": str(self.workdir / "certs"),
            },
            "metrics": {"bindAddress": "0"},  # "0": no metrics server
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        }
        config_file = self.workdir / "config.yaml"
        config_file.write_text(json.dumps(config, indent=2))
        args = [a for f in self.crds for a in ("-f", str(f))]
        self.kube.kubectl("apply", "--server-side", *args)
        self.kube.kubectl("wait", "--for=condition=Established", "--timeout=60s", *args)
        try:
            with self.log.open("ab") as log:
                self._proc = subprocess.Popen(
                    [
                        str(self.binary),
                        f"--kubeconfig={self.kube.kubeconfig}",
                        f"--config={config_file}",
                        "--leader-elect=false",
                        "--zap-devel=false",
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=self.workdir,
                    start_new_session=True,
                    preexec_fn=None if self.detach else _die_with_parent,
                )
            deadline = time.monotonic() + timeout
            self._wait(deadline, "readyz", lambda: _http_ok(health_port, "/readyz"))
            self._wait(deadline, "webhook server", lambda: _tls_answers(webhook_port, ca))
            url = f"https://127.0.0.1:{webhook_port}"
            for doc in webhook_configurations(self.webhook_dir, url, ca):
                self.kube.create(doc)
                self._webhooks.append((doc["kind"].lower(), doc["metadata"]["name"]))
        except BaseException:
            self.stop()
            raise

    def check_alive(self) -> None:
        if self._proc is not None and self._proc.poll() is not None:
            raise ControlPlaneError(
                f"lws exited with {self._proc.returncode}; {self.log}:\n{_tail(self.log)}"
            )

    def stop(self, timeout: float = 15.0) -> None:
        # Webhooks first: a registered hook whose server is gone would refuse LWS objects.
        for kind, name in reversed(self._webhooks):
            self.kube.kubectl("delete", kind, name, "--ignore-not-found", check=False)
        self._webhooks = []
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def _wait(self, deadline: float, what: str, ready: Any) -> None:
        while True:
            self.check_alive()
            with contextlib.suppress(OSError, http.client.HTTPException):
                if ready():
                    return
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"lws {what} not ready in time; {self.log}:\n"
                                        f"{_tail(self.log)}")  # fmt: skip
            time.sleep(0.1)


def _http_ok(port: int, path: str) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        return resp.status == 200
    finally:
        conn.close()


def _tls_answers(port: int, ca: bytes) -> bool:
    """The webhook server completes a handshake with the certificate made for it."""
    ctx = ssl.create_default_context(cadata=ca.decode())
    with (
        socket.create_connection(("127.0.0.1", port), timeout=2) as sock,
        ctx.wrap_socket(sock, server_hostname="127.0.0.1"),
    ):
        return True
