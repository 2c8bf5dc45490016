"""``sie-worker plan FILE [--devices LIST] [--profile NAME] [--rank K]``: what a load would do.

Prints ``{"model", "width", "devices", "argv", "env", "memory_bytes"}`` (and ``cores``) as
JSON, built by the same ``resolve_load_options`` and ``plan_launch`` the worker uses, for an
empty worker with ``--devices`` (else ``SIE_DEVICES``) and the bundle ``SIE_BUNDLE`` names
(its engine release's flag spellings: SGLang's, or vLLM's on the ``vllm`` bundle): the model
goes on the first block of its width, with real free ports. ``env`` is the delta over the
worker's environment; on cpu devices ``cores`` lists the cores the engine runs on. ``memory_bytes``
is what the model reserves on each of its devices (null where device memory is unknown: set
``SIE_FAKE_MEMORY_BUDGET``, e.g. 80GiB, to plan for a GPU of that size); with it known, the
engine's share (SGLang's ``--mem-fraction-static``, vLLM's ``--gpu-memory-utilization`` and,
on cpu devices, ``VLLM_CPU_KVCACHE_SPACE``; the default engine's ``--cuda-memory-fraction``)
is the one it gets on an empty device. Starts nothing.
A model whose weights come from the hub runs from its snapshot folder in the Hugging Face
cache (``--model-path``) when the snapshot is complete there; otherwise the plan shows the
hub id and a note on stderr says that a load downloads it first (``sie-worker fetch``).
With ``--rank K`` (and ``SIE_NODES``, ``SIE_LEADER_ADDRESS`` set as in the group's pods;
``SIE_NODE_RANK`` is taken to be K) it plans rank K of a model the group serves, one wider
than the worker's devices: ``width`` is the model's whole width, ``devices`` the width / N
this rank claims from ``cuda:0``, the argv carries the engine's multi-node flags, and
``rank``, ``nodes`` and ``rendezvous`` (the leader's host and the group's port) are added.
The model counts as pinned (a note on stderr when ``SIE_PINNED_MODELS`` lacks it).
Warnings (an option accepted but not applied here, a bundle that does not serve the
adapter) go to stderr. Exit 1 with the refusal (one ``FILE: <json-path>: <message>``
line per problem) when the load would be refused; exit 2 when the environment itself is unusable.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

from sie_worker.commands.validate import settings_for
from sie_worker.config.adapters import serving_bundles
from sie_worker.config.files.reader import load_config_file
from sie_worker.config.load.load_options import adapter_of
from sie_worker.config.load.loadtime import resolve_load_options
from sie_worker.config.model import DEFAULT_PROFILE, served_model
from sie_worker.engines.registry import family_of
from sie_worker.errors import InvalidConfig, Problem
from sie_worker.settings import Settings, SettingsError
from sie_worker.sizing.capacity import add_gpu_arguments, hardware_from_args, served_model_warnings
from sie_worker.sizing.gpus import GpuError
from sie_worker.worker.launcher import ports
from sie_worker.worker.launcher.plan import plan_launch
from sie_worker.worker.launcher.ranks import group_rank
from sie_worker.worker.placement.claims import need_of, share_at_start
from sie_worker.worker.placement.memory import device_memory
from sie_worker.worker.weights.cache import HubSettings, cached_snapshot
from sie_worker.worker.weights.model_key import model_key

__all__ = ["register", "run"]


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "plan",
        help="print the engine command line and environment a load would use",
        description=__doc__.split("\n\n", 1)[1].replace("``", "") if __doc__ else None,
    )
    parser.add_argument("file", metavar="FILE", type=Path, help="model config file")
    parser.add_argument("--devices", metavar="LIST", help="the worker's devices (cuda:0,cuda:1)")
    parser.add_argument(
        "--profile",
        metavar="NAME",
        default=DEFAULT_PROFILE,
        help="the profile to plan, served as <sie_id>:<NAME> (default: default)",
    )
    parser.add_argument(
        "--rank",
        metavar="K",
        type=int,
        default=None,
        help="plan rank K of a group of nodes (needs SIE_NODES and SIE_LEADER_ADDRESS)",
    )
    # Capacity warnings (stderr) when a GPU is named here or by $SIE_GPU_TYPE.
    add_gpu_arguments(parser, per_node=False)
    parser.set_defaults(func=run)


def _settings(devices: str | None, rank: int | None) -> Settings:
    """The worker's settings; with ``rank``, those of that rank of the group."""
    if rank is None:
        return settings_for(devices)
    env = dict(os.environ)
    if devices is not None:
        env["SIE_DEVICES"] = devices
    if not env.get("SIE_NODES", "").strip():
        raise SettingsError(
            "--rank needs SIE_NODES (the group's nodes) and SIE_LEADER_ADDRESS (rank 0's host) "
            "set as in the group's pods, e.g. SIE_NODES=2 SIE_LEADER_ADDRESS=sie-0.sie"
        )
    env["SIE_NODE_RANK"] = str(rank)
    return Settings.from_env(env)


def run(args: argparse.Namespace) -> int:
    try:
        settings = _settings(args.devices, args.rank)
        hardware = hardware_from_args(args)
    except (SettingsError, GpuError) as exc:
        print(f"sie-worker plan: {exc}", file=sys.stderr)
        return 2
    try:
        config = load_config_file(args.file)
        try:
            served = served_model(config, args.profile)
        except KeyError as exc:
            raise InvalidConfig([Problem("$.profiles", str(exc.args[0]), str(args.file))]) from None
        if args.rank is not None and served.id not in settings.pinned_models:
            print(
                f"note: SIE_PINNED_MODELS lacks {served.id}; planned as if it were pinned (after "
                "the models it names): a group serves only pinned models",
                file=sys.stderr,
            )
            settings = settings.with_overrides(pinned_models=(*settings.pinned_models, served.id))
        options = resolve_load_options(served, settings)
    except InvalidConfig as exc:
        for problem in exc.problems:
            print(problem)
        return 1
    if options.model_path is None and settings.weights_download == "worker":
        key = model_key(served, settings)
        snapshot = cached_snapshot(key, HubSettings.from_env(os.environ))
        if snapshot is not None:
            options = dataclasses.replace(options, model_path=str(snapshot.path))
        else:
            print(
                f"note: {key} is not complete in the Hugging Face cache; a load downloads it "
                "first and starts the engine from its snapshot folder; "
                f"`sie-worker fetch {args.file}` fetches it now",
                file=sys.stderr,
            )
    group = None
    if args.rank is not None:
        if not options.grouped:
            print(
                f"sie-worker plan: --rank: {served.id} (width {options.width}) fits this "
                f"worker's {len(settings.devices)} device(s), so one worker serves it, not the "
                "group; plan it without --rank",
                file=sys.stderr,
            )
            return 2
        group = group_rank(served.id, options.nccl_port, settings)
    devices = settings.devices[: options.claim_width]
    adapter = adapter_of(served, settings)
    family = family_of(adapter.engine)
    warnings = list(options.warnings)
    if settings.bundle not in serving_bundles(adapter):
        version = options.engine_version
        release = f" with {family.label} {version}'s flags" if version else ""
        warnings.append(
            f"{adapter.__name__} is served by the {' or '.join(serving_bundles(adapter))} "
            f"bundle; this plan is for SIE_BUNDLE={settings.bundle}{release}"
        )
    nccl_port = None
    if group is None and family.picks_rendezvous and options.nccl_port is None:
        nccl_port = ports.pick_port(ports.RENDEZVOUS_PORTS)
    nccl_port = nccl_port or options.nccl_port
    port = ports.pick_port(ports.ENGINE_PORTS, {nccl_port} if nccl_port else ())
    memory = device_memory(settings)
    need = need_of(options, memory, on_cpu=not devices[0].startswith("cuda"))
    # An empty worker: all of each device is free.
    on_cuda = devices[0].startswith("cuda")
    share = share_at_start(
        served, options, on_cuda=on_cuda, need=need, totals=memory.totals[: len(devices)]
    )
    plan = plan_launch(
        served,
        options,
        devices,
        port=port,
        nccl_port=nccl_port,
        settings=settings,
        share=share,
        group=group,
        notes=True,
    )
    for message in warnings:
        print(f"warning: {args.file}: {message}", file=sys.stderr)
    if hardware is not None:
        for warning in served_model_warnings(served, hardware, devices=len(settings.devices)):
            print(f"warning: {warning}", file=sys.stderr)
    print(json.dumps({**plan.summary(), "memory_bytes": need}, indent=2))
    return 0
