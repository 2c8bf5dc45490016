"""What an engine's process group holds, read from ``/proc``: its processes, the ones that are
its ranks, and the shared-memory files they use.

A real engine is several processes (vLLM: an API server, an engine core, one worker per rank,
a resource tracker) in the group the launcher started it in. They share memory through files
in ``/dev/shm`` (vLLM's CPU all-reduce, its message queues), which a process killed by a
signal never unlinks: the launcher reads which files the group maps or holds open while it
runs (:func:`shared_memory_of`) and removes them once the group is gone
(:func:`remove_files`). Linux only; elsewhere every reading is empty.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "SHM",
    "Member",
    "group_members",
    "named_files",
    "process_exited",
    "ranks_of",
    "remove_files",
    "shared_memory_of",
    "unclaimed_files",
]

SHM = Path("/dev/shm")
_PROC = Path("/proc")


@dataclass(frozen=True)
class Member:
    pid: int
    title: str  # its first argv word: the title setproctitle gives it (VLLM::Worker_TP0)


def group_members(pgid: int, proc: Path = _PROC) -> list[Member]:
    """The live processes of process group ``pgid`` (zombies left out)."""
    found: list[Member] = []
    try:
        entries = list(proc.iterdir())
    except OSError:
        return found
    for entry in entries:
        if not entry.name.isdigit():
            continue
        stat = _stat(entry)
        if stat is None:
            continue
        state, group = stat
        if group == pgid and state != "Z":
            found.append(Member(int(entry.name), _title(entry)))
    return sorted(found, key=lambda m: m.pid)


def ranks_of(members: Iterable[Member], pattern: re.Pattern[str] | None) -> list[Member]:
    """The members whose title matches the engine's rank pattern."""
    if pattern is None:
        return []
    return [m for m in members if pattern.search(m.title)]


def shared_memory_of(pids: Iterable[int], proc: Path = _PROC, shm: Path = SHM) -> set[Path]:
    """The files under ``shm`` that these processes map or hold open."""
    found: set[Path] = set()
    prefix = f"{shm}/"
    for pid in pids:
        base = proc / str(pid)
        with contextlib.suppress(OSError):
            for line in (base / "maps").read_text(errors="replace").splitlines():
                fields = line.split(maxsplit=5)  # address perms offset dev inode [path]
                path = fields[5].strip().removesuffix(" (deleted)") if len(fields) == 6 else ""
                if path.startswith(prefix):
                    found.add(Path(path))
        with contextlib.suppress(OSError):
            for fd in (base / "fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith(prefix):
                        found.add(Path(target.removesuffix(" (deleted)")))
    return found


def named_files(patterns: Iterable[str], pids: Iterable[int], shm: Path = SHM) -> set[Path]:
    """The files under ``shm`` an engine family names after one of ``pids`` (each pattern a
    glob with ``{pid}``): what a process killed before its files were seen mapped left."""
    chosen = list(pids)
    return {
        path for pattern in patterns for pid in chosen for path in shm.glob(pattern.format(pid=pid))
    }


def unclaimed_files(
    patterns: Iterable[str], since: float, shm: Path = SHM, proc: Path = _PROC
) -> set[Path]:
    """The files under ``shm`` matching ``patterns`` (names tied to no pid, such as SGLang's
    ``sglang_loads_*``), changed since ``since`` (epoch seconds), that no live process maps
    or holds open: what an engine group killed before its files were seen left behind. A
    file of another engine still running is held by it, so it stays."""
    candidates: dict[Path, int] = {}
    for pattern in patterns:
        for path in shm.glob(pattern):
            with contextlib.suppress(OSError):
                stat = path.stat()
                if stat.st_ctime >= since:
                    candidates[path] = stat.st_ino
    if not candidates:
        return set()
    live = [int(entry.name) for entry in proc.iterdir() if entry.name.isdigit()]
    held = _inodes_held(live, proc, shm)
    return {path for path, inode in candidates.items() if inode not in held}


def _inodes_held(pids: Iterable[int], proc: Path, shm: Path) -> set[int]:
    """The inodes of the files on ``shm``'s filesystem that these processes map or hold open.

    By inode, not name (a file mapped by its name has its inode too): glibc's ``sem_open``
    creates a semaphore under a temporary name, maps it, then links it to its own name
    (``sem.mp-*``) and unlinks the first, so its creator's maps show ``/dev/shm/sem.XXXXXX
    (deleted)``. By name, a starting engine's semaphores looked held by no one and were
    removed when another engine stopped: its spawned ranks then failed to open them
    (``FileNotFoundError``)."""
    try:
        device = os.stat(shm).st_dev
    except OSError:
        return set()
    wanted = f"{os.major(device):02x}:{os.minor(device):02x}"
    held: set[int] = set()
    for pid in pids:
        base = proc / str(pid)
        with contextlib.suppress(OSError):
            for line in (base / "maps").read_text(errors="replace").splitlines():
                fields = line.split(maxsplit=5)  # address perms offset dev inode [path]
                if len(fields) >= 5 and fields[3] == wanted:
                    with contextlib.suppress(ValueError):
                        held.add(int(fields[4]))
        with contextlib.suppress(OSError):
            for fd in (base / "fd").iterdir():
                with contextlib.suppress(OSError):
                    stat = os.stat(fd)  # the open file itself, even when unlinked
                    if stat.st_dev == device:
                        held.add(stat.st_ino)
    return held


def remove_files(paths: Iterable[Path]) -> list[Path]:
    """Unlink the files that still exist; the ones removed."""
    removed: list[Path] = []
    for path in sorted(paths):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(path)
    return removed


def _stat(entry: Path) -> tuple[str, int] | None:
    """``(state, pgid)`` from ``/proc/<pid>/stat`` (the name may hold spaces and parens)."""
    try:
        text = (entry / "stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()
    try:
        return fields[0], int(fields[2])
    except (IndexError, ValueError):
        return None


def _title(entry: Path) -> str:
    try:
        raw = (entry / "cmdline").read_bytes()
    except OSError:
        raw = b""
    title = raw.split(b"\0", 1)[0].decode(errors="replace").strip()
    if title:
        return title
    try:
        return (entry / "comm").read_text().strip()
    except OSError:
        return ""


async def process_exited(pid: int, *, child: bool = True) -> None:
    """Wait until process ``pid`` has exited (a pidfd becomes readable; polling without one).
    ``child``: whether it is this process's child (else it is polled by signal 0)."""
    try:
        fd = os.pidfd_open(pid)
    except (OSError, AttributeError):
        alive = _running if child else _exists
        while alive(pid):  # noqa: ASYNC110 - no event to wait on without a pidfd
            await asyncio.sleep(0.05)
        return
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    loop.add_reader(fd, _set_once, done)
    try:
        await done
    finally:
        loop.remove_reader(fd)
        os.close(fd)


def _set_once(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _running(pid: int) -> bool:
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return False
    return waited == 0


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
