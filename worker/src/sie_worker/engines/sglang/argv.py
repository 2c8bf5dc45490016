"""SGLang's command line for one load: ``python -m sglang.launch_server`` (or the
``SIE_SGLANG_COMMAND`` prefix), flags spelled as the checked release spells them. In order:

- ``--model-path``: ``weights_path``/``model_path`` resolved, else ``hf_id``; ``--revision``:
  ``hf_revision``/``revision`` (``loadtime.revision`` wins; hub ids only);
- ``--served-model-name`` the served id, ``--tp-size`` the tensor width, ``--pp-size`` the
  pipeline stages (above 1), on a rank of a group of nodes ``--nnodes --node-rank
  --dist-init-addr`` (:mod:`~sie_worker.worker.launcher.ranks`), then the worker's
  ``--host 127.0.0.1 --port N --nccl-port P`` (none on a group's rank) and
  ``--enable-metrics`` (the worker passes the engine's ``/metrics`` through on its own,
  :mod:`sie_worker.worker.engine_metrics`);
- on cpu devices ``--device cpu --disable-overlap-schedule`` and ``--max-total-tokens`` (its
  KV cache, from its share: SGLang on CPU would size it from the machine's free memory);
- ``--dtype``: ``compute_precision`` (``loadtime.compute_precision`` wins);
- ``--context-length``: ``loadtime.max_seq_length``, else ``max_sequence_length``, else
  (generation) ``tasks.generate.context_length``;
- ``--trust-remote-code`` unless ``trust_remote_code: false`` (SIE's default is true);
- the adapter's own (``--is-embedding``, ``--chat-template``), ``--watchdog-timeout``;
- ``--mem-fraction-static`` (the engine's share of the memory free at its start when the
  worker knows device memory, else ``mem_fraction_static`` as declared),
  ``--attention-backend``, ``--grammar-backend``, ``--reasoning-parser``,
  ``--tool-call-parser``, ``--speculative-*`` (:mod:`sie_worker.engines.sglang.flags`);
- with ``lora_paths``: ``--enable-lora --max-loras-per-batch N --lora-paths name=path ...``
  (:mod:`sie_worker.config.lora`; a hub adapter's path is its fetched snapshot);
- the prefill CUDA-graph switch (``--disable-prefill-cuda-graph`` from 0.5.20,
  ``--disable-piecewise-cuda-graph`` before), or with ``disable_cuda_graph``
  ``--cuda-graph-backend-{decode,prefill} disabled`` (0.5.19 on), ``--disable-cuda-graph``
  (before);
- ``extra_launch_args`` (either place), then the strict-thinking adapter's
  ``--enable-strict-thinking``.

``max_batch_tokens`` and ``kv_budget_tokens`` are SIE's batching and admission budgets, not
engine flags (SIE never passes them to SGLang): SGLang sizes its KV pool from
``mem_fraction_static``.
"""

from __future__ import annotations

from collections.abc import Mapping

from sie_worker.config.adapters import resolve_adapter
from sie_worker.config.lora import sglang_lora_args
from sie_worker.engines.sglang.family import SGLANG
from sie_worker.engines.sglang.flags import SGLANG_OPTIONS, speculative_args
from sie_worker.engines.sglang.release import (
    disable_cuda_graph_args,
    engine_version,
    prefill_graph_flag,
)
from sie_worker.worker.launcher.argv_inputs import ENGINE_HOST, ArgvInputs

__all__ = ["sglang_argv"]

# The options passed as ``--flag value``, in this order (the others are handled above).
_VALUE_FLAGS = (
    "mem_fraction_static",
    "attention_backend",
    "grammar_backend",
    "reasoning_parser",
    "tool_call_parser",
    "stream_interval",
)


def sglang_argv(inputs: ArgvInputs) -> tuple[str, ...]:
    served, options, settings = inputs.served, inputs.options, inputs.settings
    profile = served.profile
    loadtime = profile.loadtime
    version = inputs.version or options.engine_version or engine_version(settings.bundle)
    adapter = resolve_adapter(options.adapter)
    argv = inputs.command(SGLANG)
    argv += inputs.model_source("--model-path")
    argv += ["--served-model-name", served.id, *inputs.parallel(SGLANG, "--tp-size", "--pp-size")]
    argv += ["--host", ENGINE_HOST, "--port", str(inputs.port)]
    if inputs.nccl_port is not None and inputs.group is None:
        argv += ["--nccl-port", str(inputs.nccl_port)]
    argv.append("--enable-metrics")
    if inputs.on_cpu:
        # Its CPU engine runs without the overlap scheduler (CUDA streams), and its KV cache
        # is its share in tokens: on CPU SGLang sizes it from the machine's free memory. An
        # idle scheduler busy-polls its queues (1.4 cores of two for an idle TP=2 engine),
        # taking the cores from the worker and every model beside it; asleep on idle it
        # waits in zmq's poll, which a request wakes at once.
        argv += ["--device", "cpu", "--disable-overlap-schedule", "--sleep-on-idle"]
        if inputs.share is not None and inputs.share.kv_tokens is not None:
            argv += ["--max-total-tokens", str(inputs.share.kv_tokens)]
    if inputs.precision:
        argv += ["--dtype", inputs.precision]
    if options.context_length is not None:
        argv += ["--context-length", str(options.context_length)]
    if loadtime.get("trust_remote_code", True) is True:
        argv.append("--trust-remote-code")
    own = adapter.engine_args(
        {**loadtime, "extra_launch_args": profile.extra_launch_args}, profile.runtime
    )
    last = [a for a in own if a in adapter.added_flags and a != "--is-embedding"]
    argv += [a for a in own if a not in last]
    if options.watchdog_timeout_s is not None:
        argv += ["--watchdog-timeout", _seconds(options.watchdog_timeout_s)]
    for name in _VALUE_FLAGS:
        value, flag = loadtime.get(name), SGLANG_OPTIONS[name].flag
        if name == "mem_fraction_static" and inputs.fraction is not None:
            value = inputs.fraction
        if value is not None and flag is not None:
            argv += [flag, str(value)]
    spec = loadtime.get("speculative")
    if isinstance(spec, Mapping):
        argv += speculative_args(spec)
    if options.loras:
        argv += sglang_lora_args(options.loras, options.max_loras_per_batch or 4)
    if options.disable_cuda_graph:
        # Graphs off entirely: the prefill switch then has no effect, so it is omitted.
        if loadtime.get("disable_cuda_graph") is True:
            argv += disable_cuda_graph_args(version)
    elif options.disable_piecewise_cuda_graph:
        argv.append(prefill_graph_flag(version))
    argv += profile.extra_launch_args
    argv += last  # SIE's strict-thinking adapter appends its flag to extra_launch_args
    return tuple(argv)


def _seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))
