"""Free local ports for engines: HTTP from 30000-30399, rendezvous (NCCL) from 30400-30499.

A port is free when it is not in the caller's in-use set (ports of engines still starting)
and a bind test on 127.0.0.1 succeeds. The scan starts at a random offset so worker
containers sharing one pod's network namespace rarely race for the same port.
"""

from __future__ import annotations

import errno
import random
import socket
from collections.abc import Collection

from sie_worker.errors import LoadFailed

__all__ = ["ENGINE_PORTS", "RENDEZVOUS_PORTS", "NoFreePort", "pick_port", "port_is_free"]

ENGINE_PORTS = range(30000, 30400)
RENDEZVOUS_PORTS = range(30400, 30500)
_HOST = "127.0.0.1"


class NoFreePort(LoadFailed):
    """Every port of the range is taken (load_failed, 502)."""


def port_is_free(port: int, host: str = _HOST) -> bool:
    """Whether a listener could bind ``host:port`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As the engine's server will: a port whose old connections linger in TIME_WAIT can
        # be listened on again, so it is free, not taken.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL):
                return False
            raise
    return True


def pick_port(
    candidates: range,
    in_use: Collection[int] = (),
    *,
    host: str = _HOST,
    rng: random.Random | None = None,
) -> int:
    """A free port of ``candidates`` not in ``in_use``; :class:`NoFreePort` when none is."""
    count = len(candidates)
    start = (rng or random).randrange(count) if count else 0
    for step in range(count):
        port = candidates[(start + step) % count]
        if port not in in_use and port_is_free(port, host):
            return port
    raise NoFreePort(
        f"no free port in {candidates.start}-{candidates.stop - 1} on {host}: "
        f"{len(set(in_use) & set(candidates))} are held by this worker's engines and the rest "
        "are taken by other processes; unload a model or free ports in that range"
    )
