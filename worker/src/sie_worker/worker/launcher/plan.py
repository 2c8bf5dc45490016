"""What one load runs: the engine's command line, environment and cores. Pure functions, no
processes. One builder (:func:`plan_launch`) serves the worker and ``sie-worker plan``.

The engine's family (:mod:`sie_worker.engines`) builds its command line, flags spelled as the
release the load was checked for (the bundle's), and its device binding. The environment is
the profile's ``extra_env``, ``SGLANG_ENABLE_SPEC_V2=1`` with speculative decoding (as SIE
sets it), then ``CUDA_VISIBLE_DEVICES`` (the block's GPUs; empty on cpu devices) and the
family's binding (:meth:`~sie_worker.engines.family.EngineFamily.device_env`), written last.
An engine on cpu devices runs on their cores: a family that binds its ranks itself (vLLM)
keeps the container's CPUs; every other engine gets the block's cores as its process's
affinity (``cores``), which the processes it starts inherit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from sie_server.adapters.base import EngineKind
from sie_worker.config.adapters import resolve_adapter
from sie_worker.config.load.load_options import LoadOptions
from sie_worker.config.model import ServedModel
from sie_worker.devices import core_list, cuda_mask
from sie_worker.engines.family import EngineFamily
from sie_worker.engines.registry import PRODUCT_FAMILY, family_of
from sie_worker.settings import Settings
from sie_worker.sizing.memory_needs import EngineShare
from sie_worker.worker.launcher.argv_inputs import ENGINE_HOST, ArgvInputs
from sie_worker.worker.launcher.ranks import GroupRank

__all__ = [
    "ENGINE_HOST",
    "LaunchPlan",
    "engine_argv",
    "engine_env",
    "engine_of",
    "env_delta",
    "exports_metrics",
    "family_of_load",
    "plan_launch",
]


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
    notes: Mapping[str, object] = field(default_factory=dict)  # the family's (sie-worker plan)

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
        return {**summary, **self.notes}


def plan_launch(
    served: ServedModel,
    options: LoadOptions,
    devices: tuple[str, ...],
    *,
    port: int,
    nccl_port: int | None,
    settings: Settings,
    version: str | None = None,
    share: EngineShare | None = None,
    group: GroupRank | None = None,
    notes: bool = False,
) -> LaunchPlan:
    """Everything the launcher needs for one engine, for the worker and ``sie-worker plan``
    alike. ``nccl_port`` is the port the worker picked for a rendezvous (the family decides
    whether it takes it: :meth:`EngineFamily.rendezvous`); ``version`` overrides the checked
    release (tests, tools); ``share`` is what the engine is told of its memory
    (:func:`~sie_worker.sizing.memory_needs.engine_share`); ``group`` this worker's rank of a
    model a group of nodes serves (its rendezvous port replaces ``nccl_port``); ``notes``:
    add what the family shows beside the command line (``sie-worker plan``; reads files)."""
    if len(devices) != options.claim_width:
        raise ValueError(
            f"{served.id}: width {options.claim_width} placed on {len(devices)} devices"
        )
    if options.grouped != (group is not None):
        raise ValueError(f"{served.id}: a group model needs its rank, and only it has one")
    family = family_of_load(options)
    cores = settings.cores_of(tuple(devices))
    # A group's rank meets at the group's port; one node at the family's choice.
    declared = options.nccl_port
    nccl_port = group.port if group is not None else family.rendezvous(declared, nccl_port)
    on_cpu = not devices[0].startswith("cuda")
    inputs = ArgvInputs(
        served, options, port, nccl_port, settings, version, share, group, on_cpu, cores
    )
    # A follower that serves no HTTP (vLLM headless, llama.cpp's RPC server) is ready once started.
    headless = group is not None and not group.leads and family.follower != "serves"
    return LaunchPlan(
        model=served.id,
        width=options.width,
        devices=tuple(devices),
        argv=family.argv(inputs),
        env=MappingProxyType(env_delta(served, devices, family.kind, cores, share)),
        port=port,
        nccl_port=nccl_port,
        health_path=None if headless else family.health_path,
        options=options,
        cores=None if cores is None or family.binds_ranks else tuple(c for d in cores for c in d),
        group=group,
        notes=MappingProxyType(family.plan_notes(inputs) if notes else {}),
    )


def engine_argv(
    served: ServedModel,
    options: LoadOptions,
    *,
    port: int,
    nccl_port: int | None,
    settings: Settings,
    version: str | None = None,
    share: EngineShare | None = None,
    group: GroupRank | None = None,
    on_cpu: bool = False,
) -> tuple[str, ...]:
    """The engine's whole command line, built by its family."""
    inputs = ArgvInputs(served, options, port, nccl_port, settings, version, share, group, on_cpu)
    return family_of_load(options).argv(inputs)


def env_delta(
    served: ServedModel,
    devices: tuple[str, ...],
    engine: EngineKind = PRODUCT_FAMILY.kind,
    cores: tuple[tuple[int, ...], ...] | None = None,
    share: EngineShare | None = None,
) -> dict[str, str]:
    """The profile's ``extra_env``, ``SGLANG_ENABLE_SPEC_V2=1`` when speculative decoding is
    on, then the device binding written last (see the module docstring)."""
    family = family_of(engine)
    delta = {k: v for k, v in served.profile.extra_env.items() if not _owned(family, k)}
    spec = served.profile.loadtime.get("speculative")
    if isinstance(spec, Mapping) and spec.get("enabled") is True:
        delta["SGLANG_ENABLE_SPEC_V2"] = "1"
    delta["CUDA_VISIBLE_DEVICES"] = cuda_mask(devices)
    on_cpu = not devices[0].startswith("cuda")
    delta.update(family.device_env(on_cpu=on_cpu, cores=cores, share=share))
    return delta


def engine_env(base_env: Mapping[str, str], plan: LaunchPlan) -> dict[str, str]:
    """The engine's whole environment: the worker's, then the plan's delta, without the
    variables its family owns (llama.cpp's ``LLAMA_ARG_*``: every flag has one)."""
    family = family_of_load(plan.options)
    env = {k: v for k, v in base_env.items() if not _owned(family, k)}
    return {**env, **plan.env}


def _owned(family: EngineFamily, variable: str) -> bool:
    """Whether the family reads ``variable`` as one of its flags (the launcher clears it)."""
    return bool(family.owned_prefixes) and variable.startswith(family.owned_prefixes)


def engine_of(options: LoadOptions) -> EngineKind:
    """The engine that serves a load of these options."""
    return resolve_adapter(options.adapter).engine


def family_of_load(options: LoadOptions) -> EngineFamily:
    """The engine family that serves a load of these options."""
    return family_of(engine_of(options))


def exports_metrics(options: LoadOptions) -> bool:
    """Whether the engine of this load serves its own ``/metrics`` (SGLang's and vLLM's do)."""
    return family_of_load(options).exports_metrics
