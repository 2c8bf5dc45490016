"""vLLM's command line for one load: ``python -m vllm.entrypoints.openai.api_server`` (or the
``SIE_VLLM_COMMAND`` prefix). In order:

- ``--model``: the local folder (``weights_path``/``model_path``, or the fetched snapshot),
  else ``hf_id``; ``--revision`` for a hub id;
- ``--served-model-name`` the served id, ``--tensor-parallel-size`` the tensor width,
  ``--pipeline-parallel-size`` the stages (above 1), on a rank of a group of nodes ``--nnodes
  --node-rank --master-addr --master-port`` (``--headless`` on ranks >= 1;
  :mod:`~sie_worker.worker.launcher.ranks`), the worker's ``--host 127.0.0.1 --port N``,
  ``--master-port P`` when ``nccl_port`` is declared (one node);
- ``--disable-uvicorn-access-log`` (the worker logs each request itself, and vLLM would log
  every metrics scrape);
- ``--dtype``, ``--max-model-len`` (the context length, from the same sources as SGLang's),
  ``--trust-remote-code`` unless ``trust_remote_code: false``;
- the embedding adapter's pooling runner (``--runner pooling``);
- ``--gpu-memory-utilization``: the engine's share (``gpu_memory_utilization``, 0.9 when
  undeclared) wherever the worker knows device memory, else as declared;
- ``--enforce-eager``/``--no-enforce-eager``, ``--quantization``, ``--kv-cache-dtype``,
  ``--enable-prefix-caching``/``--no-enable-prefix-caching`` as declared;
- with ``lora_paths``: ``--enable-lora --max-loras N [--max-lora-rank R] --lora-modules
  name=path ...``;
- pipeline stages on cpu devices: ``--compilation-config '{"mode": 2, "backend": "eager"}'``
  (vLLM's CPU build warms up only in a compilation mode other than NONE, and later stages
  fail their first request without that warm-up; what forces NONE is refused at load:
  :mod:`~sie_worker.engines.vllm.checks`);
- ``extra_launch_args``.
"""

from __future__ import annotations

from sie_worker.config.adapters import resolve_adapter
from sie_worker.engines.vllm.checks import PIPELINE_ON_CPU_COMPILATION
from sie_worker.engines.vllm.family import VLLM
from sie_worker.engines.vllm.flags import VLLM_OPTIONS, vllm_lora_args
from sie_worker.worker.launcher.argv_inputs import ENGINE_HOST, ArgvInputs

__all__ = ["vllm_argv"]

# Boolean options: true -> the flag, false -> its --no- form.
_SWITCHES = ("enforce_eager", "enable_prefix_caching")
_VALUES = ("quantization", "kv_cache_dtype")


def vllm_argv(inputs: ArgvInputs) -> tuple[str, ...]:
    served, options = inputs.served, inputs.options
    profile = served.profile
    loadtime = profile.loadtime
    argv = inputs.command(VLLM)
    argv += inputs.model_source("--model")
    argv += ["--served-model-name", served.id]
    argv += inputs.parallel(VLLM, "--tensor-parallel-size", "--pipeline-parallel-size")
    argv += ["--host", ENGINE_HOST, "--port", str(inputs.port)]
    if inputs.nccl_port is not None and inputs.group is None:
        argv += ["--master-port", str(inputs.nccl_port)]
    argv.append("--disable-uvicorn-access-log")
    if inputs.precision:
        argv += ["--dtype", inputs.precision]
    if options.context_length is not None:
        argv += ["--max-model-len", str(options.context_length)]
    if loadtime.get("trust_remote_code", True) is True:
        argv.append("--trust-remote-code")
    argv += resolve_adapter(options.adapter).engine_args(loadtime, profile.runtime)
    utilization = (
        inputs.fraction if inputs.fraction is not None else loadtime.get("gpu_memory_utilization")
    )
    if utilization is not None:
        argv += ["--gpu-memory-utilization", str(utilization)]
    for name in _SWITCHES:
        flag = VLLM_OPTIONS[name].flag
        if isinstance(loadtime.get(name), bool) and flag is not None:
            argv.append(flag if loadtime[name] else flag.replace("--", "--no-", 1))
    for name in _VALUES:
        flag = VLLM_OPTIONS[name].flag
        if loadtime.get(name) is not None and flag is not None:
            argv += [flag, str(loadtime[name])]
    if options.loras:
        rank = loadtime.get("max_lora_rank")
        argv += vllm_lora_args(
            options.loras, options.max_loras_per_batch or 4, rank if isinstance(rank, int) else None
        )
    if inputs.on_cpu and options.stages > 1:
        argv += ["--compilation-config", PIPELINE_ON_CPU_COMPILATION]
    argv += profile.extra_launch_args
    return tuple(argv)
