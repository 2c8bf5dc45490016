"""What every engine's command line is built from (:class:`ArgvInputs`), and the pieces the
engines' argv builders share. Pure."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from sie_server.adapters.base import EngineKind
from sie_worker.config.engine_families import EngineFamily
from sie_worker.config.load.load_options import LoadOptions
from sie_worker.config.model import ServedModel
from sie_worker.settings import Settings
from sie_worker.worker.launcher.ranks import GroupRank, rank_args

__all__ = ["ENGINE_HOST", "ArgvInputs"]

ENGINE_HOST = "127.0.0.1"


@dataclass(frozen=True)
class ArgvInputs:
    """One load's command-line inputs: the model, its checked options, the engine's ports,
    the worker's settings, a release to build for instead of the checked one (tests, tools),
    the engine's memory flag (its share; None: the declared option as it is), this worker's
    rank of a group of nodes, and whether the block is of cpu devices."""

    served: ServedModel
    options: LoadOptions
    port: int
    nccl_port: int | None
    settings: Settings
    version: str | None = None
    share: float | None = None
    group: GroupRank | None = None  # this worker's rank of a group model's engine
    on_cpu: bool = False  # placed on cpu devices
    kv_tokens: int | None = None  # SGLang's KV cache on cpu devices (--max-total-tokens)

    def parallel(self, engine: EngineKind, tensor_flag: str, stages_flag: str) -> list[str]:
        """The tensor width, the pipeline stages (above 1) and, for a rank of a group of
        nodes, the engine's multi-node flags (:mod:`~sie_worker.worker.launcher.ranks`)."""
        options = self.options
        args = [tensor_flag, str(options.tensor_width)]
        if options.stages > 1:
            args += [stages_flag, str(options.stages)]
        if self.group is not None:
            args += rank_args(engine, self.group)
        return args

    def command(self, family: EngineFamily) -> list[str]:
        """The engine's command: its ``SIE_*_COMMAND`` prefix, else ``python -m <module>``.
        A headless rank runs the family's headless command instead (vLLM: ``vllm serve``):
        in place of ``-m <module>`` at the end of the prefix, else after ``python``."""
        override = {
            "SIE_SGLANG_COMMAND": self.settings.sglang_command,
            "SIE_VLLM_COMMAND": self.settings.vllm_command,
        }.get(family.command_variable or "")
        command = list(override or (sys.executable, "-m", family.module))
        group, headless = self.group, family.headless_command
        if group is None or group.leads or headless is None:
            return command
        if command[-2:] == ["-m", family.module]:
            return [*command[:-2], "-m", *headless]
        return command  # a wrapper of its own: it is told --headless

    def model_source(self, flag: str) -> list[str]:
        """``flag <path>`` (the local folder, else the hub id), and ``--revision`` for a hub id."""
        args = [flag, self.options.model_path or self.served.config.hf_id]
        revision = self.served.revision
        if revision and not self.options.model_path:
            args += ["--revision", str(revision)]
        return args

    @property
    def precision(self) -> str | None:
        """``compute_precision``, the load-time option's over the profile's."""
        profile = self.served.profile
        value = profile.loadtime.get("compute_precision", profile.compute_precision)
        return str(value) if value else None
