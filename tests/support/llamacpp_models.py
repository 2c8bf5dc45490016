"""Model configs the worker serves with the real llama.cpp of the tests (``llama-server`` and
``ggml-rpc-server`` in ``.tools/bin``, scripts/setup-llamacpp), and the worker's command for
it. A missing binary fails the test, saying how to build it: never skipped."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from tests.support.llamacpp_engine import LLAMA_SERVER, RPC_SERVER, llamacpp_binary

__all__ = ["LLAMACPP_BUNDLE", "LLAMACPP_GENERATION", "llamacpp_command", "llamacpp_model"]

LLAMACPP_BUNDLE = "llamacpp"
LLAMACPP_GENERATION = "sie_server.adapters.llamacpp.generation:LlamaCppGenerationAdapter"


def llamacpp_command() -> str:
    """``SIE_LLAMACPP_COMMAND`` for the worker under test: the built ``llama-server`` (its
    ``ggml-rpc-server`` is found beside it)."""
    llamacpp_binary(RPC_SERVER)
    return shlex.join([str(llamacpp_binary(LLAMA_SERVER))])


def llamacpp_model(sie_id: str, folder: Path, *, width: int = 1, **loadtime: Any) -> dict[str, Any]:
    """A config of the GGUF model in ``folder`` served by llama.cpp at ``width``."""
    options = {"tensor_parallel_size": width, "startup_timeout_s": 120, **loadtime}
    options.setdefault("request_read_timeout_s", 120)
    return {
        "sie_id": sie_id,
        "model_path": str(folder),
        "max_sequence_length": 256,
        "tasks": {"generate": {"max_output_tokens": 64}},
        "profiles": {
            "default": {
                "adapter_path": LLAMACPP_GENERATION,
                "adapter_options": {"loadtime": options},
            }
        },
    }
