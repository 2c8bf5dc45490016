"""The engine's command line and environment for one load: pure functions, no processes.

SGLang adapters run ``python -m sglang.launch_server`` (or the ``SIE_SGLANG_COMMAND``
prefix); the transformers adapters run ``python -m sie_worker.engines.transformers``. Flag
spellings are those of the SGLang release the load was checked for (the bundle's).

SGLang arguments, in order:

- ``--model-path``: ``weights_path``/``model_path`` resolved, else ``hf_id``; ``--revision``:
  ``hf_revision``/``revision`` (``loadtime.revision`` wins; hub ids only);
- ``--served-model-name`` the served id, ``--tp-size`` the width, then the worker's
  ``--host 127.0.0.1 --port N --nccl-port P`` and ``--enable-metrics`` (the worker passes
  the engine's ``/metrics`` through on its own, :mod:`sie_worker.worker.engine_metrics`);
- ``--dtype``: ``compute_precision`` (``loadtime.compute_precision`` wins);
- ``--context-length``: ``loadtime.max_seq_length``, else ``max_sequence_length``, else
  (generation) ``tasks.generate.context_length``;
- ``--trust-remote-code`` unless ``trust_remote_code: false`` (SIE's default is true);
- the adapter's own (``--is-embedding``, ``--chat-template``), ``--watchdog-timeout``;
- ``--mem-fraction-static`` (the engine's ``share`` of the memory free at its start when the
  worker knows device memory, else ``mem_fraction_static`` as declared),
  ``--attention-backend``, ``--grammar-backend``,
  ``--reasoning-parser``, ``--tool-call-parser``, ``--speculative-*``
  (:mod:`sie_worker.config.sglang_flags`);
- with ``lora_paths``: ``--enable-lora --max-loras-per-batch N --lora-paths name=path ...``
  (:mod:`sie_worker.config.lora`; a hub adapter's path is its fetched snapshot);
- the prefill CUDA-graph switch (``--disable-prefill-cuda-graph`` from 0.5.20,
  ``--disable-piecewise-cuda-graph`` before), or with ``disable_cuda_graph``
  ``--cuda-graph-backend-{decode,prefill} disabled`` (0.5.19 on), ``--disable-cuda-graph``
  (before);
- ``extra_launch_args`` (either place), then the strict-thinking adapter's
  ``--enable-strict-thinking``.

The transformers engine gets ``--cuda-memory-fraction`` (its ``share``: the cap of its CUDA
allocator) when the worker knows device memory.

``max_batch_tokens`` and ``kv_budget_tokens`` are SIE's batching and admission budgets, not
engine flags (SIE never passes them to SGLang): SGLang sizes its KV pool from
``mem_fraction_static``. Environment: the profile's ``extra_env``, ``SGLANG_ENABLE_SPEC_V2=1``
with speculative decoding (as SIE sets it), then ``CUDA_VISIBLE_DEVICES`` written last.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from sie_worker.config.adapters import resolve_adapter
from sie_worker.config.load_options import LoadOptions
from sie_worker.config.lora import sglang_lora_args
from sie_worker.config.model import ServedModel
from sie_worker.config.sglang_flags import SGLANG_OPTIONS, speculative_args
from sie_worker.config.sglang_release import (
    disable_cuda_graph_args,
    engine_version,
    prefill_graph_flag,
)
from sie_worker.devices import cuda_mask
from sie_worker.settings import Settings

__all__ = [
    "ENGINE_HOST",
    "HEALTH_PATH",
    "TRANSFORMERS_ENGINE",
    "LaunchPlan",
    "engine_argv",
    "engine_env",
    "env_delta",
    "exports_metrics",
    "plan_launch",
]

ENGINE_HOST = "127.0.0.1"
HEALTH_PATH = "/health"
TRANSFORMERS_ENGINE = "sie_worker.engines.transformers"
# The options passed as ``--flag value``, in this order (the others are handled above).
_VALUE_FLAGS = (
    "mem_fraction_static",
    "attention_backend",
    "grammar_backend",
    "reasoning_parser",
    "tool_call_parser",
    "stream_interval",
)


@dataclass(frozen=True)
class LaunchPlan:
    model: str
    width: int
    devices: tuple[str, ...]
    argv: tuple[str, ...]  # full command line, SIE_SGLANG_COMMAND prefix applied
    env: Mapping[str, str]  # the delta over the worker's env: extra_env then mask
    port: int
    nccl_port: int | None
    health_path: str  # "/health"
    options: LoadOptions

    def summary(self) -> dict[str, object]:
        """What ``sie-worker plan`` prints."""
        return {
            "model": self.model,
            "width": self.width,
            "devices": list(self.devices),
            "argv": list(self.argv),
            "env": dict(self.env),
        }


def plan_launch(
    served: ServedModel,
    options: LoadOptions,
    devices: tuple[str, ...],
    *,
    port: int,
    nccl_port: int | None,
    settings: Settings,
    sglang_version: str | None = None,
    share: float | None = None,
) -> LaunchPlan:
    """Everything the launcher needs for one engine. ``nccl_port`` is ignored by the
    transformers engine; ``sglang_version`` overrides the checked release (tests, tools);
    ``share`` is the engine's memory share (see the module docstring)."""
    if len(devices) != options.width:
        raise ValueError(f"{served.id}: width {options.width} placed on {len(devices)} devices")
    sglang = _is_sglang(options)
    argv = engine_argv(
        served,
        options,
        port=port,
        nccl_port=nccl_port,
        settings=settings,
        sglang_version=sglang_version,
        share=share,
    )
    return LaunchPlan(
        model=served.id,
        width=options.width,
        devices=tuple(devices),
        argv=argv,
        env=MappingProxyType(env_delta(served, devices)),
        port=port,
        nccl_port=nccl_port if sglang else None,
        health_path=HEALTH_PATH,
        options=options,
    )


def engine_argv(
    served: ServedModel,
    options: LoadOptions,
    *,
    port: int,
    nccl_port: int | None,
    settings: Settings,
    sglang_version: str | None = None,
    share: float | None = None,
) -> tuple[str, ...]:
    if not _is_sglang(options):
        return _transformers_argv(served, options, port=port, share=share)
    config, profile = served.config, served.profile
    loadtime = profile.loadtime
    version = sglang_version or options.sglang_version or engine_version(settings.bundle)
    adapter = resolve_adapter(options.adapter)
    argv = list(settings.sglang_command or (sys.executable, "-m", "sglang.launch_server"))
    argv += ["--model-path", options.model_path or config.hf_id]
    revision = served.revision
    if revision and not options.model_path:
        argv += ["--revision", str(revision)]
    argv += ["--served-model-name", served.id, "--tp-size", str(options.width)]
    argv += ["--host", ENGINE_HOST, "--port", str(port)]
    if nccl_port is not None:
        argv += ["--nccl-port", str(nccl_port)]
    argv.append("--enable-metrics")
    precision = loadtime.get("compute_precision", profile.compute_precision)
    if precision:
        argv += ["--dtype", str(precision)]
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
        if name == "mem_fraction_static" and share is not None:
            value = share
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


def _transformers_argv(
    served: ServedModel, options: LoadOptions, *, port: int, share: float | None
) -> tuple[str, ...]:
    config, profile = served.config, served.profile
    loadtime = profile.loadtime
    argv = [sys.executable, "-m", TRANSFORMERS_ENGINE]
    argv += ["--model-path", options.model_path or config.hf_id]
    argv += ["--host", ENGINE_HOST, "--port", str(port)]
    argv += ["--task", options.task or "encode", "--served-model-name", served.id]
    precision = loadtime.get("compute_precision", profile.compute_precision)
    if precision:
        argv += ["--dtype", str(precision)]
    argv += resolve_adapter(options.adapter).engine_args(loadtime, profile.runtime)
    revision = served.revision
    if revision and not options.model_path:
        argv += ["--revision", str(revision)]
    if options.context_length is not None:
        argv += ["--context-length", str(options.context_length)]
    for lora in options.loras:
        argv += ["--lora", f"{lora.name}={lora.source}"]
    if options.loras and options.max_loras_per_batch is not None:
        argv += ["--max-loras-per-batch", str(options.max_loras_per_batch)]
    if share is not None:
        argv += ["--cuda-memory-fraction", str(share)]
    argv += profile.extra_launch_args
    return tuple(argv)


def env_delta(served: ServedModel, devices: tuple[str, ...]) -> dict[str, str]:
    """The profile's ``extra_env``, ``SGLANG_ENABLE_SPEC_V2=1`` when speculative decoding is
    on, then the device mask written last (CPU slots: empty)."""
    delta = dict(served.profile.extra_env)
    spec = served.profile.loadtime.get("speculative")
    if isinstance(spec, Mapping) and spec.get("enabled") is True:
        delta["SGLANG_ENABLE_SPEC_V2"] = "1"
    delta["CUDA_VISIBLE_DEVICES"] = cuda_mask(devices)
    return delta


def engine_env(base_env: Mapping[str, str], plan: LaunchPlan) -> dict[str, str]:
    """The engine's whole environment: the worker's, then the plan's delta."""
    return {**base_env, **plan.env}


def exports_metrics(options: LoadOptions) -> bool:
    """Whether the engine of this load serves its own ``/metrics`` (SGLang's do)."""
    return _is_sglang(options)


def _is_sglang(options: LoadOptions) -> bool:
    return resolve_adapter(options.adapter).engine == "sglang"


def _seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))
