"""Local ports for tests: one nothing listens on, or several that differ."""

from __future__ import annotations

import contextlib
import socket

__all__ = ["free_port", "free_ports"]


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
