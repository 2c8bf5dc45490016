"""The README's example model config (a generation model, width 4), as tests build on it."""

from __future__ import annotations

from typing import Any

__all__ = ["GENERATION", "example_config", "example_profile"]

GENERATION = "sie_server.adapters.sglang.generation:SGLangGenerationAdapter"


def example_profile(**loadtime: Any) -> dict[str, Any]:
    """Its default profile; ``loadtime`` adds to or replaces its load-time options."""
    return {
        "max_batch_tokens": 16384,
        "compute_precision": "bfloat16",
        "kv_budget_tokens": 32768,
        "adapter_path": GENERATION,
        "adapter_options": {
            "loadtime": {
                "tensor_parallel_size": 4,
                "request_read_timeout_s": 600,
                "startup_timeout_s": 900,
                **loadtime,
            }
        },
    }


def example_config() -> dict[str, Any]:
    """The whole config: sie_id my-org/my-large-model, generation of 32768 tokens."""
    return {
        "sie_id": "my-org/my-large-model",
        "hf_id": "my-org/my-large-model",
        "tasks": {"generate": {"context_length": 32768, "max_output_tokens": 4096}},
        "profiles": {"default": example_profile()},
    }
