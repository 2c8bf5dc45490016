"""A command prefix that takes the engine's ``--port`` before the engine starts, for the
first LIMIT launches: the port passed the worker's bind test, then someone else bound it.

    python port_squatter.py STATE_DIR LIMIT ENGINE_ARGV...

Each squatter is a process in a session of its own (the worker's stop of the engine's
group does not reach it) holding the port for 300 s; its pid names a file in STATE_DIR.
Tests build the prefix with :func:`squatter_prefix` and end them with :func:`kill_squatters`.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import sys
import time
from pathlib import Path


def squatter_prefix(state: Path, limit: int) -> str:
    """The ``SIE_SGLANG_COMMAND`` prefix that squats the first ``limit`` launches' ports."""
    state.mkdir(parents=True, exist_ok=True)
    return shlex.join([sys.executable, __file__, str(state), str(limit)])


def squatters(state: Path) -> list[int]:
    """The pids of the squatters started so far."""
    return [int(name) for name in os.listdir(state)]


def kill_squatters(state: Path) -> None:
    for pid in squatters(state):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _main(state: str, limit: int, argv: list[str]) -> None:
    if len(os.listdir(state)) < limit:
        sock = socket.socket()
        # As the worker's bind test and the engine do: a port whose old connections are in
        # TIME_WAIT is free; a plain bind would fail there and read as "port in use" with
        # no squatter at all. A listening socket still keeps the engine off the port.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", int(argv[argv.index("--port") + 1])))
        sock.listen()
        pid = os.fork()
        if pid == 0:
            os.setsid()
            time.sleep(300)
            os._exit(0)
        sock.close()
        Path(state, str(pid)).touch()
    os.execv(argv[0], argv)


if __name__ == "__main__":
    _main(sys.argv[1], int(sys.argv[2]), sys.argv[3:])
