"""The SGLang adapters' load-time options: one table, option -> SGLang flag -> rule.

Each :class:`SGLangOption` names the adapter families that accept it (SIE's generation
family: generation, Gemma, cu130, strict thinking, and this project's chat adapter; SIE's
embedding adapter), how it is applied, the SGLang flag it means (its help text is that of
SGLang's own ``--help``, 0.5.10.post1 and 0.5.23), the value rule
(:mod:`sie_worker.config.flags.option_rules`), and the default. A flag the release lacks is
refused there (:func:`option_problem`). Pure; the resolver in
:mod:`sie_worker.config.load.loadtime` and the launch plan
(:mod:`sie_worker.worker.launcher.plan`) read it.

How options are applied (``applied``):

- ``flag``: the worker passes the SGLang flag (``--mem-fraction-static 0.9``);
- ``worker``: the worker itself applies it (width, timeouts, ports, the engine's name);
- ``inert``: accepted and without effect, as in SIE on a CUDA worker (``mlx_repo``);
- ``hook``: SIE implements it with its own code inside or around the engine (a patch of
  XGrammar, a logit processor, a verdict rewrite); stock SGLang has no such setting, so it is
  accepted, checked, and not applied (``sie-worker plan`` warns);
- ``later``: not served yet: refused with why.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from sie_worker.config.flags.option_rules import (
    SPECULATIVE_KEYS,
    Applied,
    EngineOption,
    Release,
    Rule,
    boolean,
    choice_of,
    choice_problem,
    engine_option_problem,
    fraction,
    guard,
    integer,
    lora_paths,
    mapping,
    precision,
    revision,
    sampling,
    seconds,
    speculative,
    stages,
    stops,
    template,
    text,
    width,
)

__all__ = [
    "FAMILIES",
    "SGLANG_OPTIONS",
    "SPECULATIVE_KEYS",
    "Applied",
    "EngineOption",
    "Family",
    "Release",
    "Rule",
    "choice_problem",
    "option_problem",
    "options_for",
    "speculative_args",
]

Family = Literal["generation", "embedding", "chat"]
FAMILIES: tuple[Family, ...] = ("generation", "embedding", "chat")
_GEN: frozenset[Family] = frozenset({"generation", "chat"})
_ALL: frozenset[Family] = frozenset(FAMILIES)
_EMB: frozenset[Family] = frozenset({"embedding"})


# --- the table ------------------------------------------------------------------------------


_o = EngineOption  # a row of the table, short for the rows below


_SIE_HOOK = "SIE applies it with its own code in the engine process; stock SGLang has none"
_SIE_REQUEST = "SIE's embedding adapter applies it per request; the worker relays requests as sent"

_TABLE: tuple[EngineOption, ...] = (
    # The seed's six, plus disable_cuda_graph.
    _o("tensor_parallel_size", _ALL, "worker", "--tp-size", width, "1",
       "GPUs the model is split across (the worker's block and --tp-size)"),
    _o("request_read_timeout_s", _ALL, "worker", None, seconds,
       "generation: SIE_SGLANG_GENERATE_READ_TIMEOUT_S, else none; embedding: 60",
       "seconds the worker waits for the engine's next bytes before failing the request"),
    _o("startup_timeout_s", _ALL, "worker", None, seconds, "SIE_MODEL_READY_TIMEOUT_S, else 900",
       "seconds the worker waits for the engine to be ready"),
    _o("watchdog_timeout_s", _ALL, "flag", "--watchdog-timeout", seconds, "the engine's (300)",
       "Set watchdog timeout in seconds. If a forward batch takes longer than this, the server "
       "will crash to prevent hanging."),
    _o("disable_piecewise_cuda_graph", _ALL, "flag", None, boolean,
       "true above width 1; at every width on sglang-cu130 and with its adapters",
       "turns off the prefill CUDA graph: --disable-prefill-cuda-graph (SGLang 0.5.20 and "
       "later), --disable-piecewise-cuda-graph (before)"),
    _o("nccl_port", _ALL, "worker", "--nccl-port", integer(1024, 65535),
       "a free port, 30400-30499",
       "The port for NCCL distributed environment setup. Only above width 1."),
    _o("pipeline_parallel_size", _ALL, "worker", "--pp-size", stages, "1",
       "pipeline stages: the model's width is tensor_parallel_size x this (seed 004: PP "
       "spans PCIe links and nodes); the head check applies to the tensor width"),
    _o("disable_cuda_graph", _ALL, "flag", None, boolean, "false",
       "turns CUDA graphs off entirely: --cuda-graph-backend-{decode,prefill} disabled (SGLang "
       "0.5.19 and later), --disable-cuda-graph (before)"),
    # What SIE's SGLang adapters take besides.
    _o("mem_fraction_static", _ALL, "flag", "--mem-fraction-static", fraction,
       "SGLang's (sized from the GPU; SIE passes 0.85)",
       "The fraction of the memory used for static allocation (model weights and KV cache "
       "memory pool)."),
    _o("max_seq_length", _ALL, "flag", "--context-length", integer(1, 2**31 - 1),
       "max_sequence_length, else tasks.generate.context_length, else the model's config.json",
       "The model's maximum context length."),
    _o("compute_precision", _ALL, "flag", "--dtype", precision, "the profile's compute_precision",
       "Data type for model weights and activations (overrides the profile's)."),
    _o("revision", _ALL, "flag", "--revision", revision, "hf_revision",
       "The specific model version to use (overrides hf_revision)."),
    _o("trust_remote_code", _ALL, "flag", "--trust-remote-code", boolean, "true (as in SIE)",
       "Whether or not to allow for custom models defined on the Hub in their own modeling "
       "files."),
    _o("served_model_name", _GEN, "worker", "--served-model-name", text,
       "the served id",
       "SIE's name for the engine, which clients never see; the worker names the engine after "
       "the served id (sie_id, or sie_id:profile) so answers carry the id the client asked "
       "for and SGLang never reads ':profile' as a LoRA adapter"),
    _o("attention_backend", _GEN, "flag", "--attention-backend",
       choice_of("--attention-backend"), "SGLang's", "Choose the kernels for attention layers."),
    _o("grammar_backend", _GEN, "flag", "--grammar-backend",
       choice_of("--grammar-backend", nullable=True), "SGLang's (xgrammar; SIE passes outlines)",
       "Choose the backend for grammar-guided decoding."),
    _o("reasoning_parser", _GEN, "flag", "--reasoning-parser", choice_of("--reasoning-parser"),
       "none", "Specify the parser for reasoning models."),
    _o("tool_call_parser", _GEN, "flag", "--tool-call-parser", choice_of("--tool-call-parser"),
       "none", "Specify the parser for handling tool-call interactions."),
    _o("stream_interval", _GEN, "flag", "--stream-interval", integer(1), "SGLang's (1)",
       "The interval (or buffer size) for streaming in terms of the token length. A smaller "
       "value makes streaming smoother, while a larger value makes the throughput higher"),
    _o("speculative", _GEN, "flag", "--speculative-algorithm", speculative, "off",
       "{enabled, algorithm, num_steps, eagle_topk, num_draft_tokens, draft_model, "
       "draft_model_revision} -> --speculative-* (and SGLANG_ENABLE_SPEC_V2=1)"),
    _o("speculative_needs_extra_buffer", _GEN, "worker", None, boolean, "true",
       "with speculative enabled, extra_launch_args must set the release's mamba radix cache "
       "strategy (--mamba-scheduler-strategy before SGLang 0.5.20, "
       "--mamba-radix-cache-strategy after) to extra_buffer; false skips the check"),
    _o("chat_template", frozenset({"chat"}), "flag", "--chat-template", template,
       "the tokenizer's",
       "The builtin chat template name or the path of the chat template file."),
    _o("default_sampling", _GEN, "worker", None, sampling, "none",
       "request sampling defaults, as runtime.default_sampling (which wins)"),
    _o("stop_tokens", _GEN, "worker", None, stops, "none",
       "stop strings added to requests, as runtime.stop_tokens (which wins)"),
    _o("json_number_max_digits", _GEN, "hook", None, integer(1), "none",
       f"bounds the digits of JSON numbers under xgrammar: {_SIE_HOOK}"),
    _o("thinking_budget", _GEN, "hook", None, integer(1), "none",
       f"closes the reasoning block after N tokens: {_SIE_HOOK}"),
    _o("guard", _GEN, "hook", None, guard, "none",
       f"a guard model's Yes/No verdict from logprobs: {_SIE_HOOK}"),
    _o("mlx_repo", _ALL, "inert", None, text, "none",
       "the MLX repository SIE serves on Apple silicon; no effect on CUDA"),
    _o("config_kwargs", _ALL, "inert", None, mapping, "none",
       "Hugging Face config overrides; SIE's SGLang adapters ignore them too"),
    _o("lora_paths", _ALL, "flag", "--lora-paths", lora_paths, "none",
       "LoRA adapters served on the base, chosen per request: --enable-lora "
       "--max-loras-per-batch N --lora-paths name=path ... (hub adapters are fetched first)"),
    _o("max_loras_per_batch", _ALL, "flag", "--max-loras-per-batch", integer(1),
       "SIE's: 4 (generation), 8 (embedding)",
       "Maximum number of adapters for a running batch, include base-only request."),
    # SIE's embedding adapter.
    _o("dense_dim", _EMB, "inert", None, integer(1), "tasks.encode.dense.dim",
       "the vector width SIE checks its answers against"),
    _o("normalize", _EMB, "hook", None, boolean, "true", f"L2-normalise vectors: {_SIE_REQUEST}"),
    _o("query_template", _EMB, "hook", None, text, "none", f"query formatting: {_SIE_REQUEST}"),
    _o("doc_template", _EMB, "hook", None, text, "none", f"document formatting: {_SIE_REQUEST}"),
    _o("default_instruction", _EMB, "hook", None, text, "none",
       f"query instruction: {_SIE_REQUEST}"),
    _o("append_eos", _EMB, "hook", None, boolean, "false",
       f"append the tokenizer's EOS to every text: {_SIE_REQUEST}"),
    _o("embed_concurrency", _EMB, "inert", None, integer(1), "8",
       "SIE's concurrent POSTs per batch; the worker relays each request as it comes"),
    _o("max_concurrent_dispatch", _EMB, "inert", None, integer(1), "1",
       "SIE's batches in flight; the worker relays each request as it comes"),
)  # fmt: skip
SGLANG_OPTIONS: Mapping[str, EngineOption] = {option.name: option for option in _TABLE}


def options_for(family: Family) -> tuple[str, ...]:
    """The load-time option names an adapter family accepts, in table order."""
    return tuple(o.name for o in _TABLE if family in o.families)


def option_problem(name: str, value: Any, release: Release) -> str | None:
    """Why this option's value breaks its rule (or needs a flag the release lacks), or None."""
    return engine_option_problem(SGLANG_OPTIONS[name], value, release)


def speculative_args(spec: Mapping[str, Any]) -> tuple[str, ...]:
    """The ``--speculative-*`` flags of an (already checked) enabled ``speculative`` block."""
    if spec.get("enabled") is not True:
        return ()
    args = ["--speculative-algorithm", str(spec["algorithm"]).strip().upper()]
    for key in ("num_steps", "eagle_topk", "num_draft_tokens"):
        if key in spec:
            args += [SPECULATIVE_KEYS[key], str(spec[key])]
    draft = spec.get("draft_model")
    if isinstance(draft, str) and draft.strip():
        args += [SPECULATIVE_KEYS["draft_model"], draft.strip()]
        revision = spec.get("draft_model_revision")
        if isinstance(revision, str):
            args += [SPECULATIVE_KEYS["draft_model_revision"], revision]
    return tuple(args)
