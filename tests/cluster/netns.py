"""A network namespace of the test's own, where the simulated pods' addresses are local.

kwok gives pods addresses from 10.0.0.0/24, which lead nowhere on this machine (and must
never be sent to), and the EndpointSlice controller refuses loopback addresses. So the
gateway of a cluster test runs inside a network namespace made here (``unshare --net``),
in which that range is routed to the namespace's own loopback. Bridges carry the few
connections it needs out of it through Unix sockets (which every namespace shares): to the
API server, and from a pod address to the real router serving that pod on 127.0.0.1.

    python -m tests.cluster.netns listen HOST:PORT SOCKET   # TCP in here -> the socket
    python -m tests.cluster.netns connect SOCKET HOST:PORT  # the socket -> TCP in here
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = ["POD_CIDR", "NetNamespace", "main", "namespace"]

POD_CIDR = "10.0.0.0/24"  # kwok's default pod range


class NetNamespace:
    """A network namespace held by a sleeping process; ``prefix`` runs a command inside."""

    def __init__(self) -> None:
        # Unix socket paths are short (108 bytes): not under pytest's long tmp_path.
        self.workdir = Path(tempfile.mkdtemp(prefix="sie-ns-"))
        self._holder: subprocess.Popen[bytes] | None = None
        self._bridges: list[subprocess.Popen[bytes]] = []

    @staticmethod
    def available() -> str | None:
        """None when namespaces can be made here, else why not."""
        for tool in ("unshare", "nsenter", "ip"):
            if shutil.which(tool) is None:
                return f"{tool} is not installed"
        probe = subprocess.run(
            ["unshare", "--net", "true"], capture_output=True, text=True, check=False
        )
        if probe.returncode != 0:
            return f"unshare --net failed: {probe.stderr.strip()}"
        return None

    def start(self) -> None:
        self._holder = subprocess.Popen(["unshare", "--net", "sleep", "infinity"])
        deadline = time.monotonic() + 10
        while os.readlink(f"/proc/{self._holder.pid}/ns/net") == os.readlink("/proc/self/ns/net"):
            if time.monotonic() > deadline:
                raise RuntimeError("the network namespace did not come up")
            time.sleep(0.01)
        for command in (
            ["ip", "link", "set", "lo", "up"],
            ["ip", "route", "add", "local", POD_CIDR, "dev", "lo"],
        ):
            subprocess.run([*self.prefix(), *command], check=True, capture_output=True)

    def prefix(self) -> list[str]:
        assert self._holder is not None, "start() first"
        return ["nsenter", f"--net=/proc/{self._holder.pid}/ns/net", "--"]

    def bridge_out(self, listen_port: int, target_port: int, listen_host: str = "0.0.0.0") -> None:
        """Connections to ``listen_host:listen_port`` inside reach 127.0.0.1:``target_port``."""
        path = self.workdir / f"out-{listen_port}.sock"
        self._bridge(["connect", str(path), f"127.0.0.1:{target_port}"], path, outside=True)
        self._bridge(["listen", f"{listen_host}:{listen_port}", str(path)], None, outside=False)

    def bridge_in(self, port: int) -> None:
        """Connections to ``127.0.0.1:port`` here reach ``127.0.0.1:port`` inside."""
        path = self.workdir / f"in-{port}.sock"
        self._bridge(["connect", str(path), f"127.0.0.1:{port}"], path, outside=False)
        self._bridge(["listen", f"127.0.0.1:{port}", str(path)], None, outside=True)

    def _bridge(self, args: list[str], wait_for: Path | None, *, outside: bool) -> None:
        argv = [sys.executable, "-m", "tests.cluster.netns", *args]
        if not outside:
            argv = [*self.prefix(), *argv]
        self._bridges.append(subprocess.Popen(argv, cwd=Path(__file__).resolve().parents[2]))
        deadline = time.monotonic() + 10
        while wait_for is not None and not wait_for.exists():
            assert time.monotonic() < deadline, f"bridge socket {wait_for} did not appear"
            time.sleep(0.01)

    def stop(self) -> None:
        for process in [*self._bridges, *([self._holder] if self._holder else [])]:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)
            if process.poll() is None:
                process.kill()
                process.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


def _splice(a: socket.socket, b: socket.socket) -> None:
    threads = [threading.Thread(target=_pump, args=pair, daemon=True) for pair in ((a, b), (b, a))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    a.close()
    b.close()


def _serve(server: socket.socket, connect: object) -> None:
    while True:
        client, _ = server.accept()
        try:
            upstream = connect()  # type: ignore[operator]
        except OSError:
            client.close()
            continue
        threading.Thread(target=_splice, args=(client, upstream), daemon=True).start()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    mode, first, second = args
    if mode == "listen":
        server = socket.create_server(_address(first), reuse_port=False)
        path = second

        def connect() -> socket.socket:
            s = socket.socket(socket.AF_UNIX)
            s.connect(path)
            return s

        _serve(server, connect)
    elif mode == "connect":
        server = socket.socket(socket.AF_UNIX)
        server.bind(first)
        server.listen(64)
        target = _address(second)
        _serve(server, lambda: socket.create_connection(target))
    return 0


@contextlib.contextmanager
def namespace() -> Iterator[NetNamespace]:
    ns = NetNamespace()
    ns.start()
    try:
        yield ns
    finally:
        ns.stop()


if __name__ == "__main__":
    sys.exit(main())
