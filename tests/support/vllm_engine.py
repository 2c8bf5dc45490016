"""The real vLLM of the tests: the community CPU build in ``.venv-vllm`` (scripts/setup-vllm),
and model configs for it (the tiny Llama it can serve, with attention heads of 32 as vLLM's
CPU attention needs, is the ``tiny_vllm_llama_dir`` fixture).

Tests that use it are marked ``vllm`` and run in their own ``make test`` step (a TP=2 engine
takes both cores of the machines here). A missing ``.venv-vllm`` fails them, saying how to
make it: a real engine that cannot start is never skipped.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest

from tests.support.repo import ROOT

__all__ = [
    "VLLM_GENERATION",
    "VLLM_PYTHON",
    "vllm_command",
    "vllm_model",
]

VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
VLLM_GENERATION = "sie_server.adapters.vllm.generation:VLLMGenerationAdapter"
# What a tiny model needs on the 2-core machines here: no graph capture, a small batch, and
# a small share of a cpu device (its KV cache: 1 GiB per rank).
_LOADTIME = {"enforce_eager": True, "gpu_memory_utilization": 0.05}
_ARGS = ["--max-num-seqs", "4"]


def vllm_command() -> str:
    """``SIE_VLLM_COMMAND`` for the worker under test: the CPU build's API server."""
    if not VLLM_PYTHON.is_file():
        pytest.fail(
            f"{VLLM_PYTHON} is missing: the real-engine tests need vLLM's CPU build; run "
            "scripts/setup-vllm (make test does)"
        )
    return shlex.join([str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server"])


def vllm_model(
    sie_id: str,
    model_path: Path,
    *,
    width: int = 1,
    args: list[str] | None = None,
    precision: str = "bfloat16",
    **loadtime: Any,
) -> dict[str, Any]:
    """A config of ``model_path`` served by vLLM at ``width`` in ``precision``."""
    options: dict[str, Any] = {**_LOADTIME, "tensor_parallel_size": width, **loadtime}
    options.setdefault("startup_timeout_s", 240)
    options.setdefault("request_read_timeout_s", 120)
    return {
        "sie_id": sie_id,
        "model_path": str(model_path),
        "max_sequence_length": 256,
        "tasks": {"generate": {"max_output_tokens": 64}},
        "profiles": {
            "default": {
                "adapter_path": VLLM_GENERATION,
                "compute_precision": precision,
                "extra_launch_args": [*_ARGS, *(args or [])],
                "adapter_options": {"loadtime": options},
            }
        },
    }
