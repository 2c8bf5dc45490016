"""The real SGLang of the tests: SGLang 0.5.23 (the ``sglang-cu130`` bundle's release) on cpu
devices, in ``.venv-sglang`` (scripts/setup-sglang, with the stand-in for its CPU kernel
module, ``tests/support/sgl_kernel_cpu``), and model configs for it (the tiny Llama of
``tiny_vllm_llama_dir``, in float32: SGLang's CPU kernels for 16-bit types need AMX).

Tests that use it are marked ``sglang`` and run in their own ``make test`` step (a TP=2
engine takes both cores). A missing ``.venv-sglang`` fails them, saying how to make it: a real
engine that cannot start is never skipped.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest

from tests.support.repo import ROOT

__all__ = [
    "SCHEDULER",
    "SGLANG_BUNDLE",
    "SGLANG_EMBEDDING",
    "SGLANG_GENERATION",
    "SGLANG_SHM",
    "sglang_command",
    "sglang_model",
]

SGLANG_PYTHON = ROOT / ".venv-sglang" / "bin" / "python"
SCHEDULER = "sglang::scheduler_"  # the title prefix of SGLang's rank processes
# What SGLang leaves in /dev/shm after any stop, clean or not (the worker removes them).
SGLANG_SHM = ("sgl_shm_mq_*", "sglang_loads_*")
SGLANG_BUNDLE = "sglang-cu130"
SGLANG_GENERATION = "sie_server.adapters.sglang.cuda13:SGLangCuda13Adapter"
SGLANG_EMBEDDING = "sie_server.adapters.sglang.embedding:SGLangEmbeddingAdapter"
# A small share of a cpu device (its KV cache, --max-total-tokens, follows from it), and
# budgets for two loaded cores.
_LOADTIME = {"mem_fraction_static": 0.05, "startup_timeout_s": 300}


def sglang_command() -> str:
    """``SIE_SGLANG_COMMAND`` for the worker under test: SGLang's launcher in .venv-sglang."""
    if not SGLANG_PYTHON.is_file():
        pytest.fail(
            f"{SGLANG_PYTHON} is missing: the real-engine tests need SGLang on cpu devices; "
            "run scripts/setup-sglang (make test does)"
        )
    return shlex.join([str(SGLANG_PYTHON), "-m", "sglang.launch_server"])


def sglang_model(
    sie_id: str,
    model_path: Path,
    *,
    width: int = 1,
    embedding: bool = False,
    args: list[str] | None = None,
    **loadtime: Any,
) -> dict[str, Any]:
    """A config of ``model_path`` served by SGLang at ``width`` (``embedding``: its embedding
    adapter, ``--is-embedding``)."""
    options: dict[str, Any] = {**_LOADTIME, "tensor_parallel_size": width, **loadtime}
    if not embedding:
        options.setdefault("request_read_timeout_s", 120)
    tasks: dict[str, Any] = (
        {"encode": {"dense": {"dim": 128}}}
        if embedding
        else {"generate": {"max_output_tokens": 64}}
    )
    profile: dict[str, Any] = {
        "adapter_path": SGLANG_EMBEDDING if embedding else SGLANG_GENERATION,
        "compute_precision": "float32",
        "adapter_options": {"loadtime": options},
    }
    if args:
        profile["extra_launch_args"] = list(args)
    return {
        "sie_id": sie_id,
        "model_path": str(model_path),
        "max_sequence_length": 256,
        "tasks": tasks,
        "profiles": {"default": profile},
    }
