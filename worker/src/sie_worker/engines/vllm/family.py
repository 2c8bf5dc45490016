"""vLLM as an engine family (:class:`~sie_worker.engines.family.EngineFamily`).

- Command ``python -m vllm.entrypoints.openai.api_server`` or the ``SIE_VLLM_COMMAND`` prefix;
  bundle ``vllm``; its ranks are the processes titled ``VLLM::*`` (its engine core and one
  worker per rank). A request names its LoRA adapter as ``model``.
- Ranks of a group of nodes: ``--nnodes N --node-rank K --master-addr <leader> --master-port
  <port>``, and ``--headless`` on ranks >= 1, which run ``vllm serve``
  (``python -m vllm.entrypoints.cli.main serve``: its API server module starts an engine that
  fails on a follower node) and serve no HTTP.
- On cpu devices it binds each rank itself: ``VLLM_CPU_OMP_THREADS_BIND`` one core list per
  rank, ranks in block order (its API server and engine core stay on the container's CPUs);
  its KV cache is ``VLLM_CPU_KVCACHE_SPACE`` GiB, from its share.
- Memory: ``--gpu-memory-utilization`` is a share of the device's total (0.9 when undeclared).
  On one node it finds its own rendezvous; a declared ``nccl_port`` is its --master-port.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from sie_worker.devices import core_list
from sie_worker.engines.family import EngineFamily, LoadSeries
from sie_worker.engines.vllm.release import BUNDLE_VERSIONS
from sie_worker.engines.vllm.reserved import REASONS

if TYPE_CHECKING:
    from sie_server.adapters.base import Adapter
    from sie_worker.config.flags.option_rules import Release
    from sie_worker.config.flags.option_tables import OptionTable
    from sie_worker.config.model import ServedModel
    from sie_worker.engines.family import EngineChecks
    from sie_worker.sizing.memory_needs import EngineShare
    from sie_worker.worker.launcher.argv_inputs import ArgvInputs
    from sie_worker.worker.launcher.ranks import GroupRank

__all__ = ["VLLM", "VLLMFamily"]

GENERATION = "sie_server.adapters.vllm.generation:VLLMGenerationAdapter"
EMBEDDING = "sie_server.adapters.vllm.embedding:VLLMEmbeddingAdapter"


@dataclass(frozen=True)
class VLLMFamily(EngineFamily):
    def argv(self, inputs: ArgvInputs) -> tuple[str, ...]:
        from sie_worker.engines.vllm.argv import vllm_argv

        return vllm_argv(inputs)

    def rank_args(self, group: GroupRank) -> list[str]:
        args = [
            *("--nnodes", str(group.nodes), "--node-rank", str(group.rank)),
            *("--master-addr", group.leader, "--master-port", str(group.port)),
        ]
        return args if group.leads else [*args, "--headless"]

    def device_env(
        self, *, on_cpu: bool, cores: tuple[tuple[int, ...], ...] | None, share: EngineShare | None
    ) -> dict[str, str]:
        env: dict[str, str] = {}
        if not on_cpu:
            return env
        if cores is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(core_list(c) for c in cores)
        if share is not None and share.kv_cache_gib is not None:
            env["VLLM_CPU_KVCACHE_SPACE"] = str(share.kv_cache_gib)
        return env

    def memory_need(
        self,
        total: int | None,
        *,
        on_cpu: bool,
        declared: Mapping[str, Any],
        weights_bytes: int | None,
    ) -> int | None:

        if total is None:
            return None
        return math.ceil(_utilization(declared) * total)

    def share(
        self,
        *,
        on_cuda: bool,
        need: int,
        totals: Sequence[int],
        frees: Sequence[int],
        declared: Mapping[str, Any],
        weights_bytes: int | None = None,
        kv_token_bytes: float | None = None,
    ) -> EngineShare:
        from sie_worker.sizing import memory_needs as m

        utilization = _utilization(declared)
        for total, free in zip(totals, frees, strict=True):
            wanted = math.ceil(utilization * total)
            if wanted > free:
                raise m.NoRoomAtStart(wanted, max(free, 0))
        kv = None
        if not on_cuda:
            kv = m.vllm_cpu_kv_gib(min(totals), utilization, weights_bytes, len(totals))
        return m.EngineShare(utilization, kv)

    def cpu_kv_sizing(self) -> Literal["none", "bytes", "tokens"]:
        return "bytes"

    def packed_share(
        self, total: int, free: int, fraction: float | None, reserved: int
    ) -> float | None:
        # A share of the total, if that much is free.
        return fraction if fraction is not None and reserved <= free else None

    def release(self, bundle: str, env: Mapping[str, str] | None) -> Release:
        from sie_worker.engines.vllm.checks import vllm_release_of

        return vllm_release_of(bundle, env)

    def checks(
        self,
        adapter: type[Adapter],
        served: ServedModel,
        loadtime: Mapping[str, Any],
        release: Release | None,
        *,
        on_cpu: bool,
        claim_width: int,
        extras: Mapping[str, Any],
    ) -> EngineChecks | None:
        from sie_worker.engines.vllm.checks import VLLMChecks

        assert release is not None
        return VLLMChecks(served, loadtime, release, on_cpu=on_cpu)

    def release_mismatch(self, bundle: str) -> str | None:
        from sie_worker.engines.vllm.release import release_mismatch

        return release_mismatch(bundle)

    def option_tables(self) -> tuple[OptionTable, ...]:
        from sie_worker.config.flags.option_tables import option_tables

        return option_tables("vllm")

    def default_adapter(self, tasks: Mapping[str, Any]) -> str:
        return EMBEDDING if set(tasks) == {"encode"} else GENERATION


def _utilization(declared: Mapping[str, Any]) -> float:
    from sie_worker.sizing import memory_needs as m

    value = m.declared_fraction(declared, "gpu_memory_utilization")
    return m.DEFAULT_GPU_MEMORY_UTILIZATION if value is None else value


VLLM = VLLMFamily(
    kind="vllm",
    label="vLLM",
    module="vllm.entrypoints.openai.api_server",
    command_variable="SIE_VLLM_COMMAND",
    bundles=tuple(sorted(BUNDLE_VERSIONS)),
    exports_metrics=True,
    lora_as_model=True,
    # "VLLM::EngineCore", "VLLM::Worker_TP0" ... (setproctitle)
    rank_processes=re.compile(r"^VLLM::"),
    follower="headless",
    headless_command=("vllm.entrypoints.cli.main", "serve"),
    # kv_cache_usage_perc is a share despite its name ("1 means 100 percent usage",
    # vLLM 0.32's v1/metrics/loggers.py)
    load_series=LoadSeries(
        waiting="vllm:num_requests_waiting",
        running="vllm:num_requests_running",
        kv_usage="vllm:kv_cache_usage_perc",
    ),
    binds_ranks=True,
    shm_orphans=("sem.mp-*",),  # multiprocessing's semaphores of a killed rank
    adapters=(GENERATION, EMBEDDING),
    own_adapters=(GENERATION, EMBEDDING),
    owned_variables=("VLLM_CPU_OMP_THREADS_BIND",),
    reserved=REASONS,
    memory_option="gpu_memory_utilization",
    memory_flag="--gpu-memory-utilization",
)
