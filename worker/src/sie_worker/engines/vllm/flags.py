"""The vLLM adapters' load-time options: one table, option -> vLLM flag -> rule.

Each row (:class:`~sie_worker.config.flags.option_rules.EngineOption`) names the adapter families
that accept it (``generation``: OpenAI chat and completions, SIE generate; ``embedding``:
vLLM's pooling runner, OpenAI embeddings, SIE encode), how it is applied, the vLLM flag it
means (help text from vLLM 0.32.0's own ``--help``), the value rule and the default. A flag
the release lacks is refused there (:func:`option_problem`). Options of SGLang's adapters that
vLLM has no flag for (``mem_fraction_static``, ``watchdog_timeout_s``, ...) are not here, so
a load refuses them with the closest accepted spelling, as any unknown option.

Memory: ``gpu_memory_utilization`` is vLLM's share of the device's *total* memory for this
instance (SGLang's ``mem_fraction_static`` is a share of what is free at its start); the
worker reserves exactly that share on each device of the model's block and always passes it
where it knows device memory (:mod:`sie_worker.sizing.memory_needs`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from sie_worker.config.flags.option_rules import (
    EngineOption,
    Release,
    boolean,
    choice_of,
    engine_option_problem,
    fraction,
    integer,
    lora_paths,
    precision,
    revision,
    sampling,
    seconds,
    stages,
    stops,
    text,
    width,
)
from sie_worker.config.lora import LoraAdapter

__all__ = [
    "DEFAULT_GPU_MEMORY_UTILIZATION",
    "FAMILIES",
    "VLLM_OPTIONS",
    "Family",
    "option_problem",
    "options_for",
    "vllm_lora_args",
]

Family = Literal["generation", "embedding"]
FAMILIES: tuple[Family, ...] = ("generation", "embedding")
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's own default
_ALL: frozenset[Family] = frozenset(FAMILIES)
_GEN: frozenset[Family] = frozenset({"generation"})


_o = EngineOption  # a row of the table, short for the rows below


_TABLE: tuple[EngineOption, ...] = (
    _o("tensor_parallel_size", _ALL, "worker", "--tensor-parallel-size", width, "1",
       "devices the model is split across (the worker's block and --tensor-parallel-size)"),
    _o("request_read_timeout_s", _ALL, "worker", None, seconds,
       "generation: SIE_SGLANG_GENERATE_READ_TIMEOUT_S, else none; embedding: 60",
       "seconds the worker waits for the engine's next bytes before failing the request"),
    _o("startup_timeout_s", _ALL, "worker", None, seconds, "SIE_MODEL_READY_TIMEOUT_S, else 900",
       "seconds the worker waits for the engine to be ready"),
    _o("gpu_memory_utilization", _ALL, "flag", "--gpu-memory-utilization", fraction,
       "0.9 (vLLM's)",
       "The fraction of device memory to be used for the model executor: a share of the "
       "device's total for this instance (on cpu devices, of the device's memory; its KV "
       "cache, VLLM_CPU_KVCACHE_SPACE, is that share less the weights)"),
    _o("max_seq_length", _ALL, "flag", "--max-model-len", integer(1, 2**31 - 1),
       "max_sequence_length, else tasks.generate.context_length, else the model's config.json",
       "Model context length (prompt and output)."),
    _o("compute_precision", _ALL, "flag", "--dtype", precision, "the profile's compute_precision",
       "Data type for model weights and activations (overrides the profile's)."),
    _o("revision", _ALL, "flag", "--revision", revision, "hf_revision",
       "The specific model version to use (overrides hf_revision)."),
    _o("trust_remote_code", _ALL, "flag", "--trust-remote-code", boolean, "true (as in SIE)",
       "Trust remote code (e.g., from HuggingFace) when downloading the model and tokenizer."),
    _o("enforce_eager", _ALL, "flag", "--enforce-eager", boolean, "false",
       "Whether to always use eager-mode PyTorch: no CUDA graphs, no torch.compile (a faster "
       "start, slower decoding)."),
    _o("quantization", _ALL, "flag", "--quantization", text, "from the model's config",
       "Method used to quantize the weights (e.g. fp8, awq, gptq)."),
    _o("kv_cache_dtype", _ALL, "flag", "--kv-cache-dtype", choice_of("--kv-cache-dtype"), "auto",
       "Data type for kv cache storage."),
    _o("enable_prefix_caching", _ALL, "flag", "--enable-prefix-caching", boolean,
       "vLLM's (on)", "Whether to enable prefix caching (false: --no-enable-prefix-caching)."),
    _o("served_model_name", _GEN, "worker", "--served-model-name", text, "the served id",
       "SIE's name for the engine, which clients never see; the worker names the engine after "
       "the served id so answers carry the id the client asked for"),
    _o("default_sampling", _GEN, "worker", None, sampling, "none",
       "request sampling defaults, as runtime.default_sampling (which wins)"),
    _o("stop_tokens", _GEN, "worker", None, stops, "none",
       "stop strings added to requests, as runtime.stop_tokens (which wins)"),
    _o("lora_paths", _GEN, "flag", "--lora-modules", lora_paths, "none",
       "LoRA adapters served on the base, chosen per request (the request's model names one): "
       "--enable-lora --max-loras N --lora-modules name=path ... (hub adapters are fetched "
       "first)"),
    _o("max_loras_per_batch", _GEN, "flag", "--max-loras", integer(1), "SIE's: 4",
       "Max number of LoRAs in a single batch."),
    _o("max_lora_rank", _GEN, "flag", "--max-lora-rank", choice_of("--max-lora-rank"),
       "vLLM's (16)", "Max LoRA rank (one of the release's choices)."),
    _o("nccl_port", _ALL, "worker", "--master-port", integer(1024, 65535),
       "vLLM's (a free port of its own on one node)",
       "the rendezvous port (vLLM's --master-port); only above width 1"),
    _o("pipeline_parallel_size", _ALL, "worker", "--pipeline-parallel-size", stages, "1",
       "pipeline stages: the model's width is tensor_parallel_size x this (seed 004: PP "
       "spans PCIe links and nodes); the head check applies to the tensor width"),
)  # fmt: skip
VLLM_OPTIONS: Mapping[str, EngineOption] = {option.name: option for option in _TABLE}


def options_for(family: Family) -> tuple[str, ...]:
    """The load-time option names an adapter family accepts, in table order."""
    return tuple(o.name for o in _TABLE if family in o.families)


def option_problem(name: str, value: Any, release: Release) -> str | None:
    """Why this option's value breaks its rule (or needs a flag the release lacks), or None.
    ``max_lora_rank`` is an integer that must be one of the release's choices."""
    if name == "max_lora_rank" and (isinstance(value, bool) or not isinstance(value, int)):
        return f"must be an integer, one of the release's --max-lora-rank choices, got {value!r}"
    return engine_option_problem(
        VLLM_OPTIONS[name], str(value) if name == "max_lora_rank" else value, release
    )


def vllm_lora_args(
    adapters: tuple[LoraAdapter, ...], max_loras: int, max_rank: int | None
) -> tuple[str, ...]:
    """vLLM's flags for these adapters (their sources already resolved): ``--enable-lora
    --max-loras N [--max-lora-rank R] --lora-modules name=path ...``. A request names its
    adapter as the ``model`` (the worker rewrites SGLang's ``lora_path`` so)."""
    if not adapters:
        return ()
    args = ["--enable-lora", "--max-loras", str(max_loras)]
    if max_rank is not None:
        args += ["--max-lora-rank", str(max_rank)]
    return (*args, "--lora-modules", *(f"{a.name}={a.source}" for a in adapters))
