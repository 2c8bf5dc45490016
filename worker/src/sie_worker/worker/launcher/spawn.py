"""How an engine process is spawned: what its child runs between fork and exec (die with
the worker, run on its cpu device's cores) and its own scratch folder."""

from __future__ import annotations

import ctypes
import getpass
import os
import signal
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

__all__ = ["engine_scratch", "preexec"]

_PR_SET_PDEATHSIG = 1

try:  # Loaded once, before any fork: the child only makes the call.
    _libc: ctypes.CDLL | None = ctypes.CDLL(None, use_errno=True)
except OSError:  # pragma: no cover - non-glibc platforms
    _libc = None


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    if _libc is not None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def preexec(cores: tuple[int, ...] | None) -> Callable[[], None]:
    """What the child runs between fork and exec: die with the worker, run on ``cores``."""

    def run() -> None:  # pragma: no cover - runs in the child between fork and exec
        _die_with_parent()
        if cores:
            os.sched_setaffinity(0, cores)

    return run


def engine_scratch(env: Mapping[str, str]) -> tuple[Path, dict[str, str]]:
    """A scratch folder for one engine (its ``TMPDIR``, under the worker's) and the engine's
    environment with it. torch's compile cache keeps its usual home under the worker's
    temporary folder, so engine restarts still find it."""
    parent = tempfile.gettempdir()
    scratch = Path(tempfile.mkdtemp(prefix="sie-engine-", dir=parent))
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # a uid with no passwd entry (OpenShift's arbitrary uids)
        user = str(os.getuid())
    cache = env.get("TORCHINDUCTOR_CACHE_DIR") or os.path.join(parent, f"torchinductor_{user}")
    return scratch, {**env, "TMPDIR": str(scratch), "TORCHINDUCTOR_CACHE_DIR": cache}
