from __future__ import annotations

from sie_worker.sizing.pool import suggest_pool


def test_pool_for_a_split_model_is_a_device_group_scaled_per_gpu() -> None:
    pool = suggest_pool(4, 20e9)
    assert (pool.gpu_count, pool.device_group) == (4, True)
    # Seed 000's l4-4x pool: shmSize 32Gi, memory 64Gi request / 128Gi limit.
    assert (pool.shm_size_gib, pool.memory_request_gib, pool.memory_limit_gib) == (32, 64, 128)


def test_pool_memory_limit_holds_the_checkpoint_and_shm() -> None:
    pool = suggest_pool(4, 141.2e9)
    assert pool.memory_limit_gib >= 141.2e9 / 2**30 + pool.shm_size_gib
    assert pool.memory_request_gib <= pool.memory_limit_gib


def test_pool_for_a_one_gpu_model_is_not_a_device_group() -> None:
    pool = suggest_pool(1, 16e9)
    assert (pool.gpu_count, pool.device_group, pool.shm_size_gib) == (1, False, 8)
