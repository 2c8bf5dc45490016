"""What a stopped engine leaves in /dev/shm that its family names after one of its processes
(SGLang's ``sgl_shm_mq_<scheduler pid>_*``), found by pid (pure over a folder)."""

from __future__ import annotations

from pathlib import Path

from sie_worker.engines.registry import family_of
from sie_worker.worker.launcher.group import named_files, remove_files


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
