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
import os
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

__all__ = ["free_port", "free_ports", "listens", "lost_its_port", "start_on_free_port"]

PORT_ATTEMPTS = 3

Server = TypeVar("Server")


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
    """Whether process ``pid`` holds a listening TCP socket on ``port``, in whichever network
    namespace it runs (a cluster test's gateway runs in one of its own).

    Read from ``/proc/<pid>/net``, which shows the process's namespace; psutil reads the
    caller's ``/proc/net`` and so never sees a socket of another namespace.
    """
    try:
        inodes = {
            target[len("socket:[") : -1]
            for fd in os.listdir(f"/proc/{pid}/fd")
            if (target := _readlink(f"/proc/{pid}/fd/{fd}")).startswith("socket:[")
        }
        net = Path(f"/proc/{pid}/net")
        # tcp6 is absent where the kernel runs without IPv6.
        tables = [net.joinpath(n).read_text() for n in ("tcp", "tcp6") if net.joinpath(n).exists()]
    except OSError:  # gone, or not ours to read
        return False
    for table in tables:
        for line in table.splitlines()[1:]:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if fields[3] == _TCP_LISTEN and local_port == port and fields[9] in inodes:
                return True
    return False


_TCP_LISTEN = "0A"  # the state column of /proc/net/tcp (include/net/tcp_states.h)


def _readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:  # the descriptor closed while we looked
        return ""


def lost_its_port(process: subprocess.Popen[bytes], log: Path) -> bool:
    """The process exited because another one had taken its port first."""
    if process.poll() is None:
        return False
    return "address already in use" in log.read_text(errors="replace").lower()


def start_on_free_port(
    launch: Callable[[int], tuple[Server, subprocess.Popen[bytes], Path]],
    ready: Callable[[Server], object] | None,
    port: int | None = None,
) -> Server:
    """``launch(port)`` a server on ``port`` (or a free one) and wait with ``ready`` (which
    raises AssertionError when it gives up; None: do not wait). A server on a free port
    that lost it to another process is launched again on a new one, up to
    :data:`PORT_ATTEMPTS` times; on a port the caller chose, never.

    ``launch`` returns the server, its process and the log its output goes to.
    """
    for attempt in range(1, PORT_ATTEMPTS + 1):
        server, process, log = launch(port or free_port())
        if ready is None:
            return server
        try:
            ready(server)
        except AssertionError:
            if port or attempt == PORT_ATTEMPTS or not lost_its_port(process, log):
                raise
            continue
        return server
    raise AssertionError("unreachable")
