"""The engine's command line and environment for one load: pure functions, no processes.

SGLang adapters run ``python -m sglang.launch_server`` (or the ``SIE_SGLANG_COMMAND``
prefix); the transformers adapter runs ``python -m sie_worker.engines.transformers``.

| config                                      | SGLang argument                                    |
|---------------------------------------------|----------------------------------------------------|
| ``model_path`` (resolved) or ``hf_id``      | ``--model-path``                                   |
| ``revision`` (hf_id only)                   | ``--revision``                                     |
| served model id                             | ``--served-model-name``                            |
| width (``tensor_parallel_size``)            | ``--tp-size``                                      |
| (the worker)                                | ``--host 127.0.0.1 --port N --nccl-port P``        |
| ``compute_precision``                       | ``--dtype``                                        |
| ``tasks.generate.context_length``           | ``--context-length``                               |
| ``tasks.encode.max_sequence_length``        | ``--context-length`` (embedding adapter)           |
| ``kv_budget_tokens``                        | ``--max-total-tokens``                             |
| ``max_batch_tokens``                        | ``--max-prefill-tokens``                           |
| embedding adapter                           | ``--is-embedding``                                 |
| ``chat_template`` (chat adapter)            | ``--chat-template``                                |
| ``watchdog_timeout_s``                      | ``--watchdog-timeout``                             |
| ``disable_piecewise_cuda_graph`` true       | ``--disable-prefill-cuda-graph`` (>= 0.5.20) or    |
|                                             | ``--disable-piecewise-cuda-graph`` (older)         |
| ``disable_cuda_graph`` true                 | ``--cuda-graph-backend-{decode,prefill} disabled`` |
| ``extra_launch_args``                       | appended last                                      |

``max_batch_tokens`` maps to ``--max-prefill-tokens`` ("the maximum number of tokens in a
prefill batch", SGLang's help) rather than ``--chunked-prefill-size``, which only sets how a
long prompt is cut into chunks and turns chunking off at -1.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from sie_worker.config.adapters import resolve_adapter
from sie_worker.config.loadtime import LoadOptions
from sie_worker.config.model import ServedModel
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
    "plan_launch",
]

ENGINE_HOST = "127.0.0.1"
HEALTH_PATH = "/health"
TRANSFORMERS_ENGINE = "sie_worker.engines.transformers"


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
) -> LaunchPlan:
    """Everything the launcher needs for one engine. ``nccl_port`` is ignored by the
    transformers engine; ``sglang_version`` overrides detection (tests, tools)."""
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
) -> tuple[str, ...]:
    if not _is_sglang(options):
        return _transformers_argv(served, options, port=port)
    config, profile = served.config, served.profile
    version = sglang_version or engine_version(settings.bundle)
    argv = list(settings.sglang_command or (sys.executable, "-m", "sglang.launch_server"))
    argv += ["--model-path", options.model_path or config.hf_id]
    if config.revision and not options.model_path:
        argv += ["--revision", config.revision]
    argv += ["--served-model-name", served.id, "--tp-size", str(options.width)]
    argv += ["--host", ENGINE_HOST, "--port", str(port)]
    if nccl_port is not None:
        argv += ["--nccl-port", str(nccl_port)]
    if profile.compute_precision:
        argv += ["--dtype", profile.compute_precision]
    context = _context_length(served, options)
    if context is not None:
        argv += ["--context-length", str(context)]
    if profile.kv_budget_tokens is not None:
        argv += ["--max-total-tokens", str(profile.kv_budget_tokens)]
    if profile.max_batch_tokens is not None:
        argv += ["--max-prefill-tokens", str(profile.max_batch_tokens)]
    argv += resolve_adapter(options.adapter).engine_args(profile.loadtime)
    if options.watchdog_timeout_s is not None:
        argv += ["--watchdog-timeout", _seconds(options.watchdog_timeout_s)]
    if options.disable_cuda_graph:
        # Graphs off entirely: the prefill switch then has no effect, so it is omitted.
        if profile.loadtime.get("disable_cuda_graph") is True:
            argv += disable_cuda_graph_args(version)
    elif options.disable_piecewise_cuda_graph:
        argv.append(prefill_graph_flag(version))
    argv += profile.extra_launch_args
    return tuple(argv)


def _transformers_argv(served: ServedModel, options: LoadOptions, *, port: int) -> tuple[str, ...]:
    config, profile = served.config, served.profile
    argv = [sys.executable, "-m", TRANSFORMERS_ENGINE]
    argv += ["--model-path", options.model_path or config.hf_id]
    argv += ["--host", ENGINE_HOST, "--port", str(port)]
    argv += ["--task", options.task or "encode", "--served-model-name", served.id]
    if profile.compute_precision:
        argv += ["--dtype", profile.compute_precision]
    argv += resolve_adapter(options.adapter).engine_args(profile.loadtime)
    if config.revision and not options.model_path:
        argv += ["--revision", config.revision]
    context = _context_length(served, options)
    if context is not None:
        argv += ["--context-length", str(context)]
    argv += profile.extra_launch_args
    return tuple(argv)


def env_delta(served: ServedModel, devices: tuple[str, ...]) -> dict[str, str]:
    """The profile's ``extra_env``, then the device mask written last (CPU slots: empty)."""
    delta = dict(served.profile.extra_env)
    delta["CUDA_VISIBLE_DEVICES"] = cuda_mask(devices)
    return delta


def engine_env(base_env: Mapping[str, str], plan: LaunchPlan) -> dict[str, str]:
    """The engine's whole environment: the worker's, then the plan's delta."""
    return {**base_env, **plan.env}


def _is_sglang(options: LoadOptions) -> bool:
    return resolve_adapter(options.adapter).engine == "sglang"


def _context_length(served: ServedModel, options: LoadOptions) -> int | None:
    tasks = served.config.tasks
    key = (
        ("encode", "max_sequence_length")
        if options.task == "encode"
        else ("generate", "context_length")
    )
    value = tasks.get(key[0], {}).get(key[1])
    return value if isinstance(value, int) else None


def _seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))
