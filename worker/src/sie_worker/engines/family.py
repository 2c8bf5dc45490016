"""The engine protocol: everything the worker knows of one engine family (SGLang, vLLM, the
default engine, llama.cpp), in one object per family.

One placement, one launcher, one proxy, one plan builder serve every engine. What differs
between engines is asked of the family serving the load
(:func:`~sie_worker.engines.registry.family_of`), never decided by comparing engine names
outside the engines' own packages (``tests/engines/test_protocol.py`` fails on any such
comparison):

- its command (``python -m <module>`` or its ``SIE_*_COMMAND`` prefix, or a program), its
  argv for one node and per rank (:meth:`EngineFamily.argv`, :meth:`EngineFamily.rank_args`),
  how a follower rank runs (:attr:`EngineFamily.follower`);
- its device binding on cpu devices (:meth:`EngineFamily.device_env`,
  :attr:`EngineFamily.binds_ranks`) and the variables it reads that the launcher owns;
- its memory: the share it is told and the flag that tells it (:class:`MemoryModel`);
- its release and the checks of a load's options against that release's parser
  (:meth:`EngineFamily.release`, :meth:`EngineFamily.checks`, :meth:`EngineFamily.option_tables`);
- its readiness path, its metric names and their model-server mapping (:class:`LoadSeries`);
- how a request names its LoRA adapter, its rank process titles, its shared-memory files;
- its default adapters and the bundles that serve an adapter.

A family module imports its behaviour (argv builders, checks, option tables) on use: the
registry is imported by settings and config modules that those import in turn.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from sie_server.adapters.base import Adapter
    from sie_worker.config.flags.option_rules import Release
    from sie_worker.config.flags.option_tables import OptionTable
    from sie_worker.config.model import JsonPath, ServedModel
    from sie_worker.settings import Settings
    from sie_worker.sizing.memory_needs import EngineShare
    from sie_worker.sizing.model_stats import ModelStats
    from sie_worker.worker.launcher.argv_inputs import ArgvInputs
    from sie_worker.worker.launcher.ranks import GroupRank

__all__ = ["EngineChecks", "EngineFamily", "Follower", "LoadSeries"]

# How a rank >= 1 of a group of nodes runs: the engine's own HTTP server (SGLang: a bare
# /health once loaded), headless (vLLM: no HTTP, ready once started), or a program of its own
# (llama.cpp: ggml-rpc-server on the rank port); None: the engine has no ranks across nodes.
Follower = Literal["serves", "headless", "rpc"]


@dataclass(frozen=True)
class LoadSeries:
    """The engine's own series of its queue, its running batch and its KV cache use (a
    share, 0..1), which the worker reads for sie_worker_requests_waiting / _running /
    sie_worker_kv_cache_usage_ratio (:mod:`sie_worker.model_server_series`)."""

    waiting: str
    running: str
    kv_usage: str


class EngineChecks(Protocol):
    """A load's options checked against the engine's release: ``(where, message)`` problems
    that refuse the load, and warnings it carries."""

    warnings: list[str]

    def problems(self) -> list[tuple[JsonPath | str, str]]: ...


@dataclass(frozen=True)
class EngineFamily:
    """One engine family. Subclasses set the data and override the behaviour that differs."""

    kind: str  # the adapters' ``engine``: "sglang", "vllm", "transformers", "llamacpp"
    label: str  # for messages: "SGLang", "vLLM", "the default engine", "llama.cpp"
    module: str | None  # run as `python -m <module>`; None: a program (:attr:`program`)
    command_variable: str | None  # the prefix that replaces the command (SIE_*_COMMAND)
    bundles: tuple[str, ...]  # the image bundles that carry it
    exports_metrics: bool  # serves its own /metrics, passed through by the worker
    lora_as_model: bool  # a request names its LoRA adapter as `model` (else `lora_path`)
    rank_processes: re.Pattern[str] | None  # titles of the processes watched as its ranks
    health_path: str = "/health"
    program: str | None = None  # the default command when it is no Python module
    follower: Follower | None = None
    # vLLM's headless rank runs `vllm serve`: this module and argument replace `-m <module>`.
    headless_command: tuple[str, ...] | None = None
    load_series: LoadSeries | None = None  # None: it exports none (the worker counts)
    # The /dev/shm files its processes leave after any stop, named after one of them
    # ("{pid}"), beside those the launcher sees its processes map: the launcher removes both
    # once the engine's group is gone.
    shm_names: tuple[str, ...] = ()
    # Its /dev/shm files named after no process (SGLang's sglang_loads_<instance>_<hash>.shm,
    # multiprocessing's sem.mp-*): removed when it stops if changed since it started and held
    # by no live process.
    shm_orphans: tuple[str, ...] = ()
    # On cpu devices it binds each rank to its core list itself (vLLM): its process keeps
    # the container's CPUs. Else the block's cores are the engine process's affinity.
    binds_ranks: bool = False
    # Variables the launcher writes (a profile's extra_env may not), and prefixes of those it
    # clears from the engine's environment and refuses in extra_env (llama.cpp's LLAMA_ARG_*).
    owned_variables: tuple[str, ...] = ()
    owned_prefixes: tuple[str, ...] = ()
    # On one node the worker picks its rendezvous port when none is declared (SGLang's
    # --nccl-port); else only a declared nccl_port is passed.
    picks_rendezvous: bool = False
    # The tensor width must divide the model's attention heads (not for llama.cpp's
    # layer split, nor for the default engine, which runs on one device).
    checks_heads: bool = True
    # The adapters this image runs on it (``module:Class``), and those of them this project
    # defines (in SIE's namespace; SIE itself has not).
    adapters: tuple[str, ...] = ()
    own_adapters: tuple[str, ...] = ()
    # Its flags the worker sets itself: dest -> (why, how to fix the config), refused in
    # extra_launch_args as its parser reads them (config/flags/reserved_flags.py).
    reserved: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    memory_option: str | None = None  # the load-time option that declares its share
    memory_flag: str | None = None  # the flag its share is passed as

    # --- the command line ------------------------------------------------------------------

    def command(self, settings: Settings, *, headless: bool = False) -> list[str]:
        """The engine's command: its ``SIE_*_COMMAND`` prefix, else ``python -m <module>``
        (or its program). A headless rank runs :attr:`headless_command` in place of
        ``-m <module>`` at the end of the prefix; a wrapper of its own is told --headless."""
        override = settings.engine_commands.get(self.command_variable or "")
        if override:
            command = list(override)
        elif self.module is not None:
            command = [sys.executable, "-m", self.module]
        else:
            command = [self.program or self.kind]
        wrapped = self.module is None or command[-2:] != ["-m", self.module]
        if headless and self.headless_command and not wrapped:
            return [*command[:-2], "-m", *self.headless_command]
        return command

    def argv(self, inputs: ArgvInputs) -> tuple[str, ...]:
        """The whole command line of one load (one node, or this worker's rank)."""
        raise NotImplementedError

    def model_stats(self, folder: Path, loadtime: Mapping[str, Any]) -> ModelStats | None:
        """What ``sie-worker size`` knows of the model in ``folder`` when its files are not a
        config.json beside safetensors (llama.cpp's GGUF); None: read those."""
        return None

    def plan_notes(self, inputs: ArgvInputs) -> dict[str, object]:
        """What ``sie-worker plan`` shows beside the command line (llama.cpp: where each
        layer goes); reads the model's files, so only the plan command asks."""
        return {}

    def rank_args(self, group: GroupRank) -> list[str]:
        """Its multi-node flags for this rank, as its parser spells them."""
        raise ValueError(
            f"{self.label} runs on one node; it has no ranks across nodes (remove SIE_NODES)"
        )

    def device_env(
        self, *, on_cpu: bool, cores: tuple[tuple[int, ...], ...] | None, share: EngineShare | None
    ) -> dict[str, str]:
        """The variables of its device binding (and any it always needs), written after the
        profile's ``extra_env`` (``CUDA_VISIBLE_DEVICES`` is every engine's and written by
        the plan builder)."""
        return {}

    def awaited_peers(self, group: GroupRank, settings: Settings) -> tuple[tuple[str, int], ...]:
        """``(host, port)`` of each peer rank that must answer before this rank's engine
        starts (llama.cpp's leader: its followers' RPC servers); () for none."""
        return ()

    def rendezvous(self, declared: int | None, picked: int | None) -> int | None:
        """The rendezvous port of a one-node load: ``picked`` is the worker's (SGLang),
        ``declared`` the profile's ``nccl_port``."""
        return picked if self.picks_rendezvous else declared

    # --- memory ------------------------------------------------------------------------------

    def memory_need(
        self,
        total: int | None,
        *,
        on_cpu: bool,
        declared: Mapping[str, Any],
        weights_bytes: int | None,
    ) -> int | None:
        """Bytes the model reserves on each of its devices of ``total`` bytes; None: unknown."""
        raise NotImplementedError

    def weight_bytes(self, folder: Path, declared: Mapping[str, Any]) -> int | None:
        """Bytes of the weights it loads from ``folder`` (None: unknown)."""
        from sie_worker.worker.weights.on_disk import weight_bytes

        return weight_bytes(folder)

    def weight_selection(self, loadtime: Mapping[str, Any]) -> tuple[str, ...]:
        """The weight files a fetch of the model's repository takes (``fnmatch`` patterns
        over its paths; a split GGUF's first part brings its other parts); (): the usual
        choice of one weight format (worker/weights/files.py)."""
        return ()

    def needs_weights(self, *, on_cpu: bool) -> bool:
        """Whether :meth:`memory_need` reads the local weights' sizes."""
        return False

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
        """What it is told of its memory when it starts on devices with ``totals`` bytes of
        which ``frees`` are free (raises NoRoomAtStart when a device has too little)."""
        raise NotImplementedError

    def packed_share(
        self, total: int, free: int, fraction: float | None, reserved: int
    ) -> float | None:
        """Its memory flag when it starts on one GPU of ``total`` bytes with ``free`` free
        (``sie-worker size``'s packing); None: it would not start there."""
        return None

    def cpu_kv_sizing(self) -> Literal["none", "bytes", "tokens"]:
        """How :meth:`share` sizes its KV cache on cpu devices: not at all, in bytes from its
        share less its weights (vLLM), or also in tokens from the model's shape (SGLang)."""
        return "none"

    # --- releases and checks -----------------------------------------------------------------

    def release(self, bundle: str, env: Mapping[str, str] | None) -> Release | None:
        """The release a load on ``bundle`` runs (its flag table when shipped); None: no
        release-specific checks."""
        return None

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
        """A load's options checked against ``release`` (``claim_width``: the devices this
        worker claims, less than the width on a rank of a group of nodes; ``extras``: the
        accepted options beyond the common ones); None: nothing engine-specific."""
        return None

    def release_mismatch(self, bundle: str) -> str | None:
        """Why the installed release differs from the bundle's (logged at start), or None."""
        return None

    def option_tables(self) -> tuple[OptionTable, ...]:
        """Its parsers' shipped tables, newest first: the spellings of reserved flags in a
        profile's ``extra_launch_args`` (empty: SGLang's, which every table ships)."""
        return ()

    def launch_arg_problems(self, args: Sequence[str]) -> list[tuple[int, str]]:
        """``(index, message)`` of each ``extra_launch_args`` token that sets a flag the worker
        sets itself, as its parser reads it (a family without tables: as SGLang's)."""
        from sie_worker.config.flags.reserved_flags import reserved_flag_problems

        return reserved_flag_problems(args, self.option_tables() or None)

    def disables_graphs(self, args: Sequence[str]) -> bool:
        """Whether ``extra_launch_args`` turn its CUDA graphs off."""
        return False

    # --- adapters ----------------------------------------------------------------------------

    def default_adapter(self, tasks: Mapping[str, Any]) -> str:
        """The adapter of a profile without ``adapter_path`` on this engine's bundles."""
        raise NotImplementedError

    def serving_bundles(self, adapter: type[Adapter]) -> tuple[str, ...]:
        """The bundles of this image that run ``adapter``, its own first."""
        return (adapter.bundle,)

    def embedding_body(self) -> Literal["texts", "shaped"]:
        """What SIE's encode sends it: the texts with what shapes them (the default engine),
        or the finished texts."""
        return "shaped"
