"""What a stopped engine leaves in /dev/shm that its family names after one of its processes
(SGLang's ``sgl_shm_mq_<scheduler pid>_*``), found by pid (pure over a folder)."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

from sie_worker.engines.registry import family_of
from sie_worker.worker.launcher.group import named_files, remove_files, unclaimed_files


def test_a_familys_named_files_are_those_of_the_processes_it_saw(tmp_path: Path) -> None:
    for name in (
        "sgl_shm_mq_101_ab12cd34",  # its TP0 scheduler's message queue
        "sgl_shm_mq_1010_ab12cd34",  # another engine's scheduler (pid 1010, not 101)
        "sgl_shm_mq_202_ffff0000",  # another engine's
        "sglang_loads_1_2.shm",  # not named after a pid: found by what the group maps
        "vllm_dist_101",
    ):
        (tmp_path / name).write_bytes(b"x")
    patterns = family_of("sglang").shm_names
    found = named_files(patterns, [101, 303], shm=tmp_path)
    assert found == {tmp_path / "sgl_shm_mq_101_ab12cd34"}
    assert remove_files(found) == [tmp_path / "sgl_shm_mq_101_ab12cd34"]
    assert not (tmp_path / "sgl_shm_mq_101_ab12cd34").exists()
    assert (tmp_path / "sgl_shm_mq_1010_ab12cd34").exists()
    assert named_files(family_of("vllm").shm_names, [101], shm=tmp_path) == set()


def _proc_with(tmp_path: Path, pid: int, maps: list[Path]) -> Path:
    """A fake /proc where ``pid`` maps ``maps`` (as /proc does: device, inode, path)."""
    proc = tmp_path / "proc"
    (proc / str(pid) / "fd").mkdir(parents=True)
    lines = [f"7f00-7f01 rw-s 00000000 {_dev(path)} {path.stat().st_ino} {path}" for path in maps]
    (proc / str(pid) / "maps").write_text("\n".join(lines) + "\n")
    return proc


def test_unclaimed_files_are_the_familys_new_ones_no_live_process_holds(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    old, held, left = (
        shm / "sglang_loads_old_1.shm",
        shm / "sglang_loads_b_2.shm",
        shm / "sglang_loads_c_3.shm",
    )
    for path in (old, held, left, shm / "unrelated"):
        path.write_bytes(b"x")
    since = time.time() - 1
    os.utime(old, (since - 3600, since - 3600))  # mtime only: ctime is what counts
    proc = _proc_with(tmp_path, 4242, [held])
    found = unclaimed_files(family_of("sglang").shm_orphans, since, shm=shm, proc=proc)
    assert held not in found  # another engine still maps it
    assert left in found
    assert shm / "unrelated" not in found
    # Files older than the engine's start are another engine's business.
    assert (
        unclaimed_files(family_of("sglang").shm_orphans, time.time() + 60, shm=shm, proc=proc)
        == set()
    )


def test_a_semaphore_its_creator_maps_under_its_first_name_is_held_not_unclaimed(
    tmp_path: Path,
) -> None:
    # glibc's sem_open maps a new semaphore under a temporary name, then links it to its own
    # name and unlinks the first: /proc/<pid>/maps shows the first name, deleted.
    shm = tmp_path / "shm"
    shm.mkdir()
    starting, orphan = shm / "sem.mp-starting", shm / "sem.mp-orphan"
    for path in (starting, orphan):
        path.write_bytes(b"x")
    dev = _dev(shm)
    proc = tmp_path / "proc"
    (proc / "4242" / "fd").mkdir(parents=True)
    (proc / "4242" / "maps").write_text(
        f"7f00-7f01 rw-s 00000000 {dev} {starting.stat().st_ino} {shm}/sem.Xy12Ab (deleted)\n"
    )
    found = unclaimed_files(family_of("vllm").shm_orphans, time.time() - 60, shm=shm, proc=proc)
    assert found == {orphan}


def test_a_file_a_live_process_holds_open_is_held_whatever_its_name_now(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    held, orphan = shm / "sem.mp-held", shm / "sem.mp-orphan"
    for path in (held, orphan):
        path.write_bytes(b"x")
    proc = tmp_path / "proc"
    (proc / "4242" / "fd").mkdir(parents=True)
    (proc / "4242" / "maps").write_text("")
    opened = os.open(held, os.O_RDONLY)
    try:
        (proc / "4242" / "fd" / "3").symlink_to(f"/proc/self/fd/{opened}")
        found = unclaimed_files(family_of("vllm").shm_orphans, time.time() - 60, shm=shm, proc=proc)
    finally:
        os.close(opened)
    assert found == {orphan}


def test_a_live_multiprocessing_lock_of_this_process_is_not_unclaimed() -> None:
    # The real thing: a spawn context's lock is a named semaphore other processes open by name.
    lock = multiprocessing.get_context("spawn").Lock()
    name = lock._semlock.name  # type: ignore[attr-defined]
    path = Path("/dev/shm") / f"sem.{name.lstrip('/')}"
    assert path.exists()
    assert path not in unclaimed_files(family_of("vllm").shm_orphans, time.time() - 60)
    del lock


def _dev(path: Path) -> str:
    """The device of ``path`` as /proc/<pid>/maps writes it (major:minor in hex)."""
    device = os.stat(path).st_dev
    return f"{os.major(device):02x}:{os.minor(device):02x}"
