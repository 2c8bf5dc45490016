"""What one load runs: the engine's command line, environment and cores. Pure functions, no
processes.

Each engine builds its own command line (:mod:`~sie_worker.worker.launcher.argv_sglang`,
:mod:`~sie_worker.worker.launcher.argv_vllm`,
:mod:`~sie_worker.worker.launcher.argv_default`), flags spelled as the release the load was
checked for (the bundle's). The environment is the same for all: the profile's
``extra_env``, ``SGLANG_ENABLE_SPEC_V2=1`` with speculative decoding (as SIE sets it), then
the device binding written last: ``CUDA_VISIBLE_DEVICES`` (the block's GPUs; empty on cpu
devices), and on cpu devices vLLM's ``VLLM_CPU_OMP_THREADS_BIND`` (one core list per rank,
ranks in block order) and ``VLLM_CPU_KVCACHE_SPACE`` (its KV cache in GiB, from its share),
or SGLang's CPU engine (``SGLANG_USE_CPU_ENGINE=1``, NCCL off,
``SGLANG_CPU_OMP_THREADS_BIND`` one core list per rank and ``OMP_NUM_THREADS`` a rank's
cores; its KV cache is ``--max-total-tokens``). An engine on cpu devices runs on their
cores: vLLM binds each rank to its list itself (its API server and engine core stay on the
container's CPUs, as vLLM places them); every other engine gets the block's cores as its
process's affinity (``cores``), which the processes it starts inherit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from sie_server.adapters.base import EngineKind
from sie_worker.config.adapters import resolve_adapter
from sie_worker.config.engine_families import SGLANG_CPU_ENV, family_of
from sie_worker.config.load.load_options import LoadOptions
from sie_worker.config.model import ServedModel
from sie_worker.devices import core_list, cuda_mask
from sie_worker.settings import Settings
from sie_worker.worker.launcher.argv_default import default_argv
from sie_worker.worker.launcher.argv_inputs import ENGINE_HOST, ArgvInputs
from sie_worker.worker.launcher.argv_sglang import sglang_argv
from sie_worker.worker.launcher.argv_vllm import vllm_argv
from sie_worker.worker.launcher.ranks import GroupRank

__all__ = [
    "ENGINE_HOST",
    "LaunchPlan",
    "engine_argv",
    "engine_env",
    "engine_of",
    "env_delta",
    "exports_metrics",
    "plan_launch",
]

_ARGV: Mapping[EngineKind, Callable[[ArgvInputs], tuple[str, ...]]] = {
    "sglang": sglang_argv,
    "vllm": vllm_argv,
    "transformers": default_argv,
}


@dataclass(frozen=True)
class LaunchPlan:
    model: str
    width: int
    devices: tuple[str, ...]
    argv: tuple[str, ...]  # full command line, SIE_*_COMMAND prefix applied
    env: Mapping[str, str]  # the delta over the worker's env: extra_env then the binding
    port: int
    nccl_port: int | None
    health_path: str | None  # "/health"; None: a headless rank, ready once started
    options: LoadOptions
    cores: tuple[int, ...] | None = None  # cpu devices: the engine process's affinity
    group: GroupRank | None = None  # this worker's rank of a group of nodes

    def summary(self) -> dict[str, object]:
        """What ``sie-worker plan`` prints (``cores``: the affinity it sets on cpu devices)."""
        summary: dict[str, object] = {
            "model": self.model,
            "width": self.width,
            "devices": list(self.devices),
            "argv": list(self.argv),
            "env": dict(self.env),
        }
        if self.cores is not None:
            summary["cores"] = core_list(self.cores)
        if self.group is not None:
            summary["rank"] = self.group.rank
            summary["nodes"] = self.group.nodes
            summary["rendezvous"] = f"{self.group.leader}:{self.group.port}"
        return summary


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
    kv_cache_gib: int | None = None,
    kv_tokens: int | None = None,
    group: GroupRank | None = None,
) -> LaunchPlan:
    """Everything the launcher needs for one engine. ``nccl_port`` is ignored by the transformers
    engine; ``sglang_version`` overrides the checked release (tests, tools); ``share`` is
    the engine's memory flag, ``kv_cache_gib`` vLLM's KV cache on cpu devices and
    ``kv_tokens`` SGLang's (:func:`~sie_worker.sizing.memory_needs.engine_share`); ``group``
    this worker's rank of a model a group of nodes serves (its rendezvous port replaces
    ``nccl_port``)."""
    if len(devices) != options.claim_width:
        raise ValueError(
            f"{served.id}: width {options.claim_width} placed on {len(devices)} devices"
        )
    if options.grouped != (group is not None):
        raise ValueError(f"{served.id}: a group model needs its rank, and only it has one")
    engine = engine_of(options)
    cores = settings.cores_of(tuple(devices))
    if group is not None:
        nccl_port = group.port
    elif engine == "vllm":
        # One node: vLLM finds its own rendezvous (a file store or a free port); a declared
        # nccl_port is its --master-port.
        nccl_port = options.nccl_port
    elif engine == "transformers":
        nccl_port = None
    argv = engine_argv(
        served,
        options,
        port=port,
        nccl_port=nccl_port,
        settings=settings,
        sglang_version=sglang_version,
        share=share,
        group=group,
        on_cpu=not devices[0].startswith("cuda"),
        kv_tokens=kv_tokens,
    )
    headless = group is not None and not group.leads and engine == "vllm"
    return LaunchPlan(
        model=served.id,
        width=options.width,
        devices=tuple(devices),
        argv=argv,
        env=MappingProxyType(env_delta(served, devices, engine, cores, kv_cache_gib)),
        port=port,
        nccl_port=nccl_port,
        health_path=None if headless else family_of(engine).health_path,
        options=options,
        cores=_affinity(engine, cores),
        group=group,
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
    group: GroupRank | None = None,
    on_cpu: bool = False,
    kv_tokens: int | None = None,
) -> tuple[str, ...]:
    """The engine's whole command line, built by its engine's builder."""
    inputs = ArgvInputs(
        served, options, port, nccl_port, settings, sglang_version, share, group, on_cpu, kv_tokens
    )
    return _ARGV[engine_of(options)](inputs)


def env_delta(
    served: ServedModel,
    devices: tuple[str, ...],
    engine: EngineKind = "sglang",
    cores: tuple[tuple[int, ...], ...] | None = None,
    kv_cache_gib: int | None = None,
) -> dict[str, str]:
    """The profile's ``extra_env``, ``SGLANG_ENABLE_SPEC_V2=1`` when speculative decoding is
    on, then the device binding written last (see the module docstring)."""
    delta = dict(served.profile.extra_env)
    spec = served.profile.loadtime.get("speculative")
    if isinstance(spec, Mapping) and spec.get("enabled") is True:
        delta["SGLANG_ENABLE_SPEC_V2"] = "1"
    delta["CUDA_VISIBLE_DEVICES"] = cuda_mask(devices)
    if engine == "vllm" and not devices[0].startswith("cuda"):
        if cores is not None:
            delta["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(core_list(c) for c in cores)
        if kv_cache_gib is not None:
            delta["VLLM_CPU_KVCACHE_SPACE"] = str(kv_cache_gib)
    if engine == "sglang" and not devices[0].startswith("cuda"):
        delta.update(SGLANG_CPU_ENV)
        if cores is not None:
            # One core set per rank, ranks in block order; without AMX SGLang applies the
            # binding only with OMP_NUM_THREADS set (its own CPU notes).
            delta["SGLANG_CPU_OMP_THREADS_BIND"] = "|".join(core_list(c) for c in cores)
            delta["OMP_NUM_THREADS"] = str(len(cores[0]))
    return delta


def _affinity(
    engine: EngineKind, cores: tuple[tuple[int, ...], ...] | None
) -> tuple[int, ...] | None:
    """The engine process's affinity: the block's cores, except for vLLM, which binds its
    ranks through VLLM_CPU_OMP_THREADS_BIND (see the module docstring)."""
    if cores is None or engine == "vllm":
        return None
    return tuple(c for device in cores for c in device)


def engine_env(base_env: Mapping[str, str], plan: LaunchPlan) -> dict[str, str]:
    """The engine's whole environment: the worker's, then the plan's delta."""
    return {**base_env, **plan.env}


def engine_of(options: LoadOptions) -> EngineKind:
    """The engine that serves a load of these options."""
    return resolve_adapter(options.adapter).engine


def exports_metrics(options: LoadOptions) -> bool:
    """Whether the engine of this load serves its own ``/metrics`` (SGLang's and vLLM's do)."""
    return family_of(engine_of(options)).exports_metrics
