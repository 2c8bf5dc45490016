"""Local ports for tests: one nothing listens on, or several that differ; and whether the
server a test started is the one answering on its port.

``free_port()`` is a race by nature: another process (a test in the other xdist worker, the
cluster suite beside the pytest step) may bind the port before the server started on it
does. That server then exits ("address already in use") while the other one answers its
readiness probe. :func:`listens` tells the two apart; the starters of tests/support start
again on a new port when :func:`lost_its_port`.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
from pathlib import Path

import psutil

__all__ = ["free_port", "free_ports", "listens", "lost_its_port"]

PORT_ATTEMPTS = 3


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (another process may still take it)."""
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` different free ports: each socket is held until all are chosen."""
    with contextlib.ExitStack() as stack:
        found: list[int] = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))
            found.append(int(sock.getsockname()[1]))
    return found


def listens(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds a listening TCP socket on ``port``."""
    try:
        connections = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.Error:
        return False
    return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in connections)


def lost_its_port(process: subprocess.Popen[bytes], log: Path) -> bool:
    """The process exited because another one had taken its port first."""
    if process.poll() is None:
        return False
    return "address already in use" in log.read_text(errors="replace").lower()
