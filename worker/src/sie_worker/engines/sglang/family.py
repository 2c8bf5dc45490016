"""SGLang as an engine family (:class:`~sie_worker.engines.family.EngineFamily`).

- Command ``python -m sglang.launch_server`` or the ``SIE_SGLANG_COMMAND`` prefix; bundles
  ``sglang``, ``sglang-cu130``; its ranks are the processes titled ``sglang::*``.
- Ranks of a group of nodes: ``--nnodes N --node-rank K --dist-init-addr <leader>:<port>``
  (only rank 0 serves requests; the others a bare ``/health`` once loaded).
- On cpu devices: its CPU engine (``SGLANG_USE_CPU_ENGINE=1``), NCCL off (a path that names no
  library, or it builds a communicator from torch's libnccl and fails "Expected a cuda
  device"), ``SGLANG_CPU_OMP_THREADS_BIND`` one core set per rank in block order and
  ``OMP_NUM_THREADS`` a rank's cores (without AMX SGLang applies the binding only then).
- Memory: ``--mem-fraction-static`` is a share of the memory free when it starts
  (:func:`~sie_worker.sizing.memory_needs.sglang_fraction`); on cpu devices its KV cache is
  capped in tokens (``--max-total-tokens``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

from sie_worker.devices import core_list
from sie_worker.engines.family import EngineFamily, LoadSeries
from sie_worker.engines.sglang.release import BUNDLE_VERSIONS
from sie_worker.engines.sglang.reserved import REASONS

if TYPE_CHECKING:
    from sie_server.adapters.base import Adapter
    from sie_worker.config.flags.option_rules import Release
    from sie_worker.config.flags.option_tables import OptionTable
    from sie_worker.config.model import ServedModel
    from sie_worker.engines.family import EngineChecks
    from sie_worker.sizing.memory_needs import EngineShare
    from sie_worker.worker.launcher.argv_inputs import ArgvInputs
    from sie_worker.worker.launcher.ranks import GroupRank

__all__ = ["SGLANG", "SGLANG_CPU_ENV", "SGLangFamily"]

SGLANG_CPU_ENV: Mapping[str, str] = MappingProxyType(
    {"SGLANG_USE_CPU_ENGINE": "1", "SGLANG_NCCL_SO_PATH": "/nonexistent/no-nccl-on-cpu-devices"}
)
GENERATION = "sie_server.adapters.sglang.generation:SGLangGenerationAdapter"
EMBEDDING = "sie_server.adapters.sglang.embedding:SGLangEmbeddingAdapter"
CHAT = "sie_server.adapters.sglang.chat:SGLangChatAdapter"
GEMMA = "sie_server.adapters.sglang.gemma:SGLangGemmaAdapter"
CUDA13 = "sie_server.adapters.sglang.cuda13:SGLangCuda13Adapter"
STRICT_THINKING = "sie_server.adapters.sglang.cuda13:SGLangStrictThinkingAdapter"


@dataclass(frozen=True)
class SGLangFamily(EngineFamily):
    def argv(self, inputs: ArgvInputs) -> tuple[str, ...]:
        from sie_worker.engines.sglang.argv import sglang_argv

        return sglang_argv(inputs)

    def rank_args(self, group: GroupRank) -> list[str]:
        leader = f"[{group.leader}]" if ":" in group.leader else group.leader
        return [
            *("--nnodes", str(group.nodes), "--node-rank", str(group.rank)),
            *("--dist-init-addr", f"{leader}:{group.port}"),
        ]

    def device_env(
        self, *, on_cpu: bool, cores: tuple[tuple[int, ...], ...] | None, share: EngineShare | None
    ) -> dict[str, str]:
        if not on_cpu:
            return {}
        env = dict(SGLANG_CPU_ENV)
        if cores is not None:
            env["SGLANG_CPU_OMP_THREADS_BIND"] = "|".join(core_list(c) for c in cores)
            env["OMP_NUM_THREADS"] = str(len(cores[0]))
        return env

    def memory_need(
        self,
        total: int | None,
        *,
        on_cpu: bool,
        declared: Mapping[str, Any],
        weights_bytes: int | None,
    ) -> int | None:
        from sie_worker.sizing import memory_needs as m

        if total is None:
            return None
        fraction = m.declared_fraction(declared, "mem_fraction_static")
        fraction = m.DEFAULT_MEM_FRACTION if fraction is None else fraction
        return math.ceil(fraction * total) + m.ENGINE_OVERHEAD_BYTES

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

        fraction = m.declared_fraction(declared, "mem_fraction_static")
        flag = min(m.sglang_fraction(t, f, fraction) for t, f in zip(totals, frees, strict=True))
        tokens = None
        if not on_cuda and kv_token_bytes:
            whole = m.DEFAULT_MEM_FRACTION if fraction is None else fraction
            tokens = m.sglang_cpu_kv_tokens(
                min(totals), whole, weights_bytes, len(totals), kv_token_bytes
            )
        return m.EngineShare(flag, kv_tokens=tokens)

    def cpu_kv_sizing(self) -> Literal["none", "bytes", "tokens"]:
        return "tokens"

    def packed_share(
        self, total: int, free: int, fraction: float | None, reserved: int
    ) -> float | None:
        from sie_worker.sizing import memory_needs as m

        try:
            return m.sglang_fraction(total, free, fraction)
        except m.NoRoomAtStart:
            return None

    def release(self, bundle: str, env: Mapping[str, str] | None) -> Release:
        from sie_worker.engines.sglang.checks import release_of

        return release_of(bundle, env)

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
        from sie_worker.engines.sglang.checks import SGLangChecks

        assert release is not None
        return SGLangChecks(adapter, served, loadtime, release)

    def release_mismatch(self, bundle: str) -> str | None:
        from sie_worker.engines.sglang.release import release_mismatch

        return release_mismatch(bundle)

    def option_tables(self) -> tuple[OptionTable, ...]:
        from sie_worker.config.flags.option_tables import option_tables

        return option_tables("sglang")

    def disables_graphs(self, args: Sequence[str]) -> bool:
        from sie_worker.config.flags.option_tables import disables_cuda_graph

        return disables_cuda_graph(args)

    def default_adapter(self, tasks: Mapping[str, Any]) -> str:
        return EMBEDDING if set(tasks) == {"encode"} else GENERATION

    def serving_bundles(self, adapter: type[Adapter]) -> tuple[str, ...]:
        from sie_worker.engines.sglang.release import version_key

        minimum = version_key(adapter.min_sglang) if adapter.min_sglang else (0, 0, 0)
        able = [b for b, v in BUNDLE_VERSIONS.items() if version_key(v) >= minimum]
        return (adapter.bundle, *sorted(b for b in able if b != adapter.bundle))


SGLANG = SGLangFamily(
    kind="sglang",
    label="SGLang",
    module="sglang.launch_server",
    command_variable="SIE_SGLANG_COMMAND",
    bundles=tuple(sorted(BUNDLE_VERSIONS)),
    exports_metrics=True,
    lora_as_model=False,
    # SGLang titles its scheduler and detokenizer processes "sglang::scheduler_TP0"...
    rank_processes=re.compile(r"^sglang::"),
    follower="serves",
    # Its TP0 scheduler's message queue (24 MiB), kept after a clean stop too.
    shm_names=("sgl_shm_mq_{pid}_*",),
    # Its load snapshot (named after a random instance id) and multiprocessing's semaphores,
    # left by a start killed before its processes were seen mapping them.
    shm_orphans=("sglang_loads_*", "sem.mp-*"),
    load_series=LoadSeries(
        waiting="sglang:num_queue_reqs",
        running="sglang:num_running_reqs",
        kv_usage="sglang:token_usage",
    ),
    owned_variables=("SGLANG_CPU_OMP_THREADS_BIND",),
    picks_rendezvous=True,
    adapters=(GENERATION, EMBEDDING, CHAT, GEMMA, CUDA13, STRICT_THINKING),
    own_adapters=(CHAT,),
    reserved=REASONS,
    memory_option="mem_fraction_static",
    memory_flag="--mem-fraction-static",
)
