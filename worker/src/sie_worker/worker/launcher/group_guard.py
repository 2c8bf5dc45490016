"""The guard of the engines' process groups: a detached process that kills every engine
group still registered, and removes the files registered with it (its scratch folder, the
shared memory it was seen using), once the worker process is gone, however it ended.

The parent-death signal reaches an engine's main process only; the ranks it spawned (which
a real engine may or may not tie to their parent) would otherwise outlive a worker killed
with SIGKILL, and the files they left would stay. Best effort: without the guard, engines
still stop with the worker in every other way.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

__all__ = ["guard", "start_group_guard"]

_log = logging.getLogger("sie_worker.engine")


# Run as `python -c`: detach (so it is nobody's engine child), then track lines "+pgid
# [scratch folder]" (an engine group), "=pgid path" (a shared-memory file it uses) and
# "-pgid" (stopped and cleaned up by the worker); end of file means the worker is gone,
# however it ended: kill what is left and remove its files.
_SCRIPT = """
import os, shutil, signal, sys
if os.fork():
    os._exit(0)
groups = {}
for line in sys.stdin.buffer:
    head, _, rest = line.rstrip(b"\\n").partition(b" ")
    try:
        pgid = int(head[1:])
    except ValueError:
        continue
    path = os.fsdecode(rest) if rest else None
    if head[:1] == b"+":
        groups[pgid] = [path] if path else []
    elif head[:1] == b"=" and path and pgid in groups:
        groups[pgid].append(path)
    else:
        groups.pop(pgid, None)
for pgid in groups:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
for paths in groups.values():
    for path in paths:
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.unlink(path)
            except OSError:
                pass
"""


class _GroupGuard:
    """Kills every registered engine process group once the worker process is gone.

    The parent-death signal only reaches an engine's main process; the ranks it spawned
    (which a real engine may or may not tie to their parent) would otherwise outlive a
    worker killed with SIGKILL. Best effort: without the guard, engines still stop with
    the worker in every other way.
    """

    def __init__(self) -> None:
        self._pipe: int | None = None  # a raw fd: closed by the process's exit, never before
        self._started = False

    def start(self) -> None:
        """Start the guard process (blocks briefly: call it at worker start, not per load)."""
        if not self._started:
            self._started = True
            self._pipe = _start_guard()

    def add(self, pgid: int, scratch: Path | None = None) -> None:
        self.start()  # already started by the worker's lifespan; a fallback for direct use
        self._send(b"+%d%s\n" % (pgid, b" " + os.fsencode(scratch) if scratch else b""))

    def files(self, pgid: int, paths: Iterable[Path]) -> None:
        """Files the group uses, removed with it if the worker dies first."""
        for path in paths:
            self._send(b"=%d %s\n" % (pgid, os.fsencode(path)))

    def remove(self, pgid: int) -> None:
        self._send(b"-%d\n" % pgid)

    def _send(self, line: bytes) -> None:
        if self._pipe is None:
            return
        try:
            os.write(self._pipe, line)
        except OSError:  # the guard is gone (killed by someone): carry on without it
            _log.warning("the engine group guard is gone; rank processes may outlive a SIGKILL")
            os.close(self._pipe)
            self._pipe = None


def _start_guard() -> int | None:
    """Start the guard; return the write end of its pipe (non-inheritable: engines never
    hold it, so it closes exactly when this process ends)."""
    read_end, write_end = os.pipe()
    try:
        process = subprocess.Popen(
            [sys.executable, "-c", _SCRIPT],
            stdin=read_end,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        process.wait(timeout=30)  # the first process exits at once; its forked child stays
    except (OSError, subprocess.SubprocessError) as exc:
        os.close(write_end)
        _log.warning(
            "cannot start the engine group guard (%s); rank processes may outlive "
            "a SIGKILL of the worker",
            exc,
        )
        return None
    finally:
        os.close(read_end)
    return write_end


guard = _GroupGuard()


def start_group_guard() -> None:
    """Start the process that kills engine groups left behind if this worker dies."""
    guard.start()
