"""What a stopped engine leaves in /dev/shm that its family names after one of its processes
(SGLang's ``sgl_shm_mq_<scheduler pid>_*``), found by pid (pure over a folder)."""

from __future__ import annotations

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
    """A fake /proc where ``pid`` maps ``maps``."""
    proc = tmp_path / "proc"
    (proc / str(pid) / "fd").mkdir(parents=True)
    lines = [f"7f00-7f01 rw-s 00000000 00:1a 42 {path}" for path in maps]
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
