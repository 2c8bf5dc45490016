"""llama.cpp as an engine family (:class:`~sie_worker.engines.family.EngineFamily`): GGUF
models on ``llama-server`` (``SIE_LLAMACPP_COMMAND``, default ``llama-server`` on PATH),
bundle ``llamacpp``.

- One process; ready when ``/health`` answers 200 (503 while it loads); ``/metrics`` with
  ``--metrics`` (``llamacpp:*``: ``requests_deferred`` is its queue, ``requests_processing``
  its running batch; the pinned release exports no KV cache use).
- Devices: the block visible (``CUDA_VISIBLE_DEVICES``), the model split by layers over them
  (:mod:`.argv`); on cpu devices one device, ``-t`` its cores, the block's cores as its
  affinity.
- Groups of nodes: followers run ``ggml-rpc-server`` on the group's port at their own
  address; the leader's ``llama-server`` names them with ``--rpc`` and starts once each of
  their ports answers (:meth:`LlamaCppFamily.awaited_peers`). Any RPC failure aborts
  llama-server (exit 134), which ends the group as any engine exit does.
- Memory: what the GGUF file needs (its bytes x 1.2 + 1 GiB, + 0.5 GiB on cpu), or the
  declared ``memory_gib``; no memory flag.
- Every flag also reads a variable (``LLAMA_ARG_*``, ``LLAMA_API_KEY``): refused in a
  profile's ``extra_env`` and cleared from the engine's environment.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sie_worker.engines.family import EngineFamily, LoadSeries
from sie_worker.engines.llamacpp.release import BUNDLE_VERSIONS, PINNED_VERSION
from sie_worker.engines.llamacpp.reserved import ENV_PREFIXES, RESERVED

if TYPE_CHECKING:
    from sie_server.adapters.base import Adapter
    from sie_worker.config.flags.option_rules import Release
    from sie_worker.config.model import ServedModel
    from sie_worker.engines.family import EngineChecks
    from sie_worker.settings import Settings
    from sie_worker.sizing.memory_needs import EngineShare
    from sie_worker.sizing.model_stats import ModelStats
    from sie_worker.worker.launcher.argv_inputs import ArgvInputs
    from sie_worker.worker.launcher.ranks import GroupRank

__all__ = ["GENERATION", "LLAMACPP", "LlamaCppFamily"]

GENERATION = "sie_server.adapters.llamacpp.generation:LlamaCppGenerationAdapter"


@dataclass(frozen=True)
class LlamaCppFamily(EngineFamily):
    def argv(self, inputs: ArgvInputs) -> tuple[str, ...]:
        from sie_worker.engines.llamacpp.argv import llamacpp_argv, rpc_argv

        command = inputs.command(self)
        if inputs.group is not None and not inputs.group.leads:
            return rpc_argv(inputs, command)
        return llamacpp_argv(inputs, command)

    def model_stats(self, folder: Path, loadtime: Mapping[str, Any]) -> ModelStats | None:
        from sie_worker.engines.llamacpp.stats import gguf_model_stats

        return gguf_model_stats(folder, loadtime)

    def plan_notes(self, inputs: ArgvInputs) -> dict[str, object]:
        from sie_worker.engines.llamacpp.argv import gguf_path
        from sie_worker.engines.llamacpp.gguf_header import block_count
        from sie_worker.engines.llamacpp.split import layer_ranges

        width, loadtime = inputs.options.claim_width, inputs.served.profile.loadtime
        if inputs.on_cpu or width < 2 or inputs.group is not None or not inputs.options.model_path:
            return {}
        layers = block_count(gguf_path(inputs.options.model_path, loadtime.get("gguf_file")))
        if layers is None:
            return {}
        split = loadtime.get("tensor_split")
        ranges, output = layer_ranges(layers, layers + 1, split or [1] * width)
        return {"layers": [*map(str, ranges), f"output on GPU{output}"]}

    def rank_args(self, group: GroupRank) -> list[str]:
        return []  # its ranks are RPC servers the leader names (argv), not flags of one engine

    def device_env(
        self, *, on_cpu: bool, cores: tuple[tuple[int, ...], ...] | None, share: EngineShare | None
    ) -> dict[str, str]:
        # An abort (any RPC failure) exits at once instead of running gdb for a backtrace.
        return {"GGML_NO_BACKTRACE": "1"}

    def weight_bytes(self, folder: Path, declared: Mapping[str, Any]) -> int | None:
        from sie_worker.engines.llamacpp.argv import gguf_path

        try:
            return Path(gguf_path(str(folder), declared.get("gguf_file"))).stat().st_size
        except OSError:
            return None

    def weight_selection(self, loadtime: Mapping[str, Any]) -> tuple[str, ...]:
        name = loadtime.get("gguf_file")
        return (name,) if isinstance(name, str) and name else ("*.gguf",)

    def awaited_peers(self, group: GroupRank, settings: Settings) -> tuple[tuple[str, int], ...]:
        from sie_worker.worker.group_peers import rank_hosts

        if not group.leads:
            return ()
        return tuple((host, group.port) for host in (rank_hosts(settings) or ())[1:])

    def memory_need(
        self,
        total: int | None,
        *,
        on_cpu: bool,
        declared: Mapping[str, Any],
        weights_bytes: int | None,
    ) -> int | None:
        from sie_worker.sizing.memory_needs import weights_need

        return weights_need(declared, weights_bytes, on_cpu=on_cpu)

    def needs_weights(self, *, on_cpu: bool) -> bool:
        return True

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
        from sie_worker.sizing.memory_needs import EngineShare

        return EngineShare(None)  # llama.cpp takes what its model and context need

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
        from sie_worker.config.load.model_shape import ModelPathError, local_model_dir
        from sie_worker.engines.llamacpp.checks import LlamaCppChecks

        try:
            folder = local_model_dir(served.config)
        except ModelPathError:
            folder = None  # the load reports it
        assert release is not None
        where = str(folder) if folder is not None else None
        return LlamaCppChecks(
            served, loadtime, release, folder=where, on_cpu=on_cpu, width=claim_width
        )

    def release(self, bundle: str, env: Mapping[str, str] | None) -> Release:
        from sie_worker.config.flags.option_rules import Release
        from sie_worker.config.flags.option_tables import table_for

        version = BUNDLE_VERSIONS.get(bundle, PINNED_VERSION)
        return Release(version, bundle, table_for(version, self.kind), self.label)

    def launch_arg_problems(self, args: Sequence[str]) -> list[tuple[int, str]]:
        from sie_worker.engines.llamacpp.checks import extra_arg_problems

        # When a config is read: the reserved flags; the release's own table is the load's.
        return extra_arg_problems(list(args), None)

    def default_adapter(self, tasks: Mapping[str, Any]) -> str:
        return GENERATION


LLAMACPP = LlamaCppFamily(
    kind="llamacpp",
    label="llama.cpp",
    module=None,
    program="llama-server",
    command_variable="SIE_LLAMACPP_COMMAND",
    bundles=tuple(sorted(BUNDLE_VERSIONS)),
    exports_metrics=True,
    lora_as_model=False,
    rank_processes=None,
    follower="rpc",
    load_series=LoadSeries(
        waiting="llamacpp:requests_deferred",
        running="llamacpp:requests_processing",
        # Exported by later releases; absent from the pinned one, where it reads 0.
        kv_usage="llamacpp:kv_cache_usage_ratio",
    ),
    owned_prefixes=ENV_PREFIXES,
    checks_heads=False,
    adapters=(GENERATION,),
    own_adapters=(GENERATION,),
    reserved=dict(RESERVED),
)
