"""The engines this image runs, as data: one :class:`EngineFamily` per engine kind.

One placement, one launcher, one proxy serve every engine; what differs between them is
here (and in each engine's option table and argv builder, which this names):

- ``sglang`` (bundles ``sglang``, ``sglang-cu130``): ``python -m sglang.launch_server`` or
  the ``SIE_SGLANG_COMMAND`` prefix; ranks ``sglang::*``;
- ``vllm`` (bundle ``vllm``): ``python -m vllm.entrypoints.openai.api_server`` or the
  ``SIE_VLLM_COMMAND`` prefix; ranks ``VLLM::*`` (its engine core and one worker per rank);
  a headless rank of a group of nodes runs ``python -m vllm.entrypoints.cli.main serve``
  (``vllm serve``; in a ``SIE_VLLM_COMMAND`` prefix ending in ``-m <module>`` that module is
  swapped for it);
- ``transformers`` (bundle ``default``): ``python -m sie_worker.engines.transformers``, one
  process.

Every engine is ready when its ``/health`` answers 200 and serves the OpenAI routes; SGLang
and vLLM export their own ``/metrics`` (``sglang:*``, ``vllm:*``), which the worker passes
through. A request's LoRA adapter reaches SGLang and the default engine as ``lora_path``,
vLLM as the request's ``model`` (:attr:`EngineFamily.lora_as_model`). The processes an engine
starts whose title matches :attr:`EngineFamily.rank_processes` are watched as its ranks: one
of them exiting fails the model, as the engine's own exit does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from sie_server.adapters.base import EngineKind
from sie_worker.config.flags import sglang_release, vllm_release

__all__ = [
    "BUNDLE_ENGINES",
    "FAMILIES",
    "IMAGE_BUNDLES",
    "SGLANG_CPU_ENV",
    "EngineFamily",
    "LoadSeries",
    "bundle_engine",
    "family_of",
]


# SGLang on cpu devices (beside its core binding, which depends on the block): its CPU
# engine, and NCCL off, or it builds a communicator from torch's bundled libnccl and fails
# ("Expected a cuda device"): a path that names no library.
SGLANG_CPU_ENV: Mapping[str, str] = MappingProxyType(
    {"SGLANG_USE_CPU_ENGINE": "1", "SGLANG_NCCL_SO_PATH": "/nonexistent/no-nccl-on-cpu-devices"}
)


@dataclass(frozen=True)
class LoadSeries:
    """The engine's own series of its queue, its running batch and its KV cache use (a
    share, 0..1), which the worker reads for sie_worker_requests_waiting / _running /
    sie_worker_kv_cache_usage_ratio (:mod:`sie_worker.model_server_series`)."""

    waiting: str
    running: str
    kv_usage: str


@dataclass(frozen=True)
class EngineFamily:
    kind: EngineKind
    label: str  # for messages: "SGLang", "vLLM", "the default engine"
    module: str  # run as `python -m <module>`
    command_variable: str | None  # the prefix that replaces `python -m <module>`
    bundles: tuple[str, ...]  # the image bundles that carry it
    exports_metrics: bool  # serves its own /metrics
    lora_as_model: bool  # a request names its LoRA adapter as `model` (else `lora_path`)
    rank_processes: re.Pattern[str] | None  # titles of the processes watched as its ranks
    health_path: str = "/health"
    # How a rank >= 1 of a group of nodes runs when it serves no HTTP (vLLM's --headless,
    # which only `vllm serve` honours: its API server module starts an engine that fails
    # on a follower node); None: the engine's own command, as rank 0's.
    headless_command: tuple[str, ...] | None = None
    load_series: LoadSeries | None = None  # None: it exports none (the worker counts)
    # The /dev/shm files its processes leave after any stop, named after one of them
    # ("{pid}"), beside those the launcher sees its processes map (vLLM's all-reduce buffers,
    # multiprocessing's sem.mp-* semaphores, SGLang's sglang_loads_*): the launcher removes
    # both once the engine's group is gone.
    shm_names: tuple[str, ...] = ()


FAMILIES: Mapping[EngineKind, EngineFamily] = MappingProxyType(
    {
        "sglang": EngineFamily(
            kind="sglang",
            label="SGLang",
            module="sglang.launch_server",
            command_variable="SIE_SGLANG_COMMAND",
            bundles=tuple(sorted(sglang_release.BUNDLE_VERSIONS)),
            exports_metrics=True,
            lora_as_model=False,
            # SGLang titles its scheduler and detokenizer processes "sglang::scheduler_TP0"...
            rank_processes=re.compile(r"^sglang::"),
            # Its TP0 scheduler's message queue (24 MiB), kept after a clean stop too.
            shm_names=("sgl_shm_mq_{pid}_*",),
            load_series=LoadSeries(
                waiting="sglang:num_queue_reqs",
                running="sglang:num_running_reqs",
                kv_usage="sglang:token_usage",
            ),
        ),
        "vllm": EngineFamily(
            kind="vllm",
            label="vLLM",
            module="vllm.entrypoints.openai.api_server",
            command_variable="SIE_VLLM_COMMAND",
            bundles=tuple(sorted(vllm_release.BUNDLE_VERSIONS)),
            exports_metrics=True,
            lora_as_model=True,
            # "VLLM::EngineCore", "VLLM::Worker_TP0" ... (setproctitle)
            rank_processes=re.compile(r"^VLLM::"),
            headless_command=("vllm.entrypoints.cli.main", "serve"),
            # kv_cache_usage_perc is a share despite its name ("1 means 100 percent usage",
            # vLLM 0.32's v1/metrics/loggers.py)
            load_series=LoadSeries(
                waiting="vllm:num_requests_waiting",
                running="vllm:num_requests_running",
                kv_usage="vllm:kv_cache_usage_perc",
            ),
        ),
        "transformers": EngineFamily(
            kind="transformers",
            label="the default engine",
            module="sie_worker.engines.transformers",
            command_variable=None,
            bundles=("default",),
            exports_metrics=False,
            lora_as_model=False,
            rank_processes=None,
        ),
    }
)
# The engine each bundle of this image runs; a bundle of another name (a custom image) is
# taken for an SGLang one, as before vLLM was served.
BUNDLE_ENGINES: Mapping[str, EngineKind] = MappingProxyType(
    {bundle: family.kind for family in FAMILIES.values() for bundle in family.bundles}
)
IMAGE_BUNDLES: tuple[str, ...] = ("default", *sorted(b for b in BUNDLE_ENGINES if b != "default"))


def family_of(kind: EngineKind) -> EngineFamily:
    return FAMILIES[kind]


def bundle_engine(bundle: str) -> EngineKind:
    """The engine the bundle's image runs (``default``: the transformers engine)."""
    return BUNDLE_ENGINES.get(bundle, "sglang")
