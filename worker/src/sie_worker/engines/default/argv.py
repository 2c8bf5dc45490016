"""The default engine's command line: ``python -m sie_worker.engines.transformers`` with the
model, the worker's host and port, the task and served id, ``--dtype``, the adapter's own
flags, the revision (hub ids), ``--context-length``, its LoRA adapters, and
``--cuda-memory-fraction`` (its share: the cap of its CUDA allocator) when the worker knows
device memory, then ``extra_launch_args``."""

from __future__ import annotations

from sie_worker.config.adapters import resolve_adapter
from sie_worker.engines.default.family import DEFAULT
from sie_worker.worker.launcher.argv_inputs import ENGINE_HOST, ArgvInputs

__all__ = ["default_argv"]


def default_argv(inputs: ArgvInputs) -> tuple[str, ...]:
    served, options = inputs.served, inputs.options
    profile = served.profile
    argv = inputs.command(DEFAULT)
    argv += ["--model-path", options.model_path or served.config.hf_id]
    argv += ["--host", ENGINE_HOST, "--port", str(inputs.port)]
    argv += ["--task", options.task or "encode", "--served-model-name", served.id]
    if inputs.precision:
        argv += ["--dtype", inputs.precision]
    argv += resolve_adapter(options.adapter).engine_args(profile.loadtime, profile.runtime)
    revision = served.revision
    if revision and not options.model_path:
        argv += ["--revision", str(revision)]
    if options.context_length is not None:
        argv += ["--context-length", str(options.context_length)]
    for lora in options.loras:
        argv += ["--lora", f"{lora.name}={lora.source}"]
    if options.loras and options.max_loras_per_batch is not None:
        argv += ["--max-loras-per-batch", str(options.max_loras_per_batch)]
    if inputs.fraction is not None:
        argv += ["--cuda-memory-fraction", str(inputs.fraction)]
    argv += profile.extra_launch_args
    return tuple(argv)
