"""What every engine's command line is built from (:class:`ArgvInputs`), and the pieces the
engines' argv builders share. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sie_worker.config.load.load_options import LoadOptions
    from sie_worker.config.model import ServedModel
    from sie_worker.engines.family import EngineFamily
    from sie_worker.settings import Settings
    from sie_worker.sizing.memory_needs import EngineShare
    from sie_worker.worker.launcher.ranks import GroupRank

__all__ = ["ENGINE_HOST", "ArgvInputs"]

ENGINE_HOST = "127.0.0.1"


@dataclass(frozen=True)
class ArgvInputs:
    """One load's command-line inputs: the model, its checked options, the engine's ports,
    the worker's settings, a release to build for instead of the checked one (tests, tools),
    what the engine is told of its memory, this worker's
    rank of a group of nodes, and whether the block is of cpu devices."""

    served: ServedModel
    options: LoadOptions
    port: int
    nccl_port: int | None
    settings: Settings
    version: str | None = None
    share: EngineShare | None = None  # None: the declared options as they are
    group: GroupRank | None = None  # this worker's rank of a group model's engine
    on_cpu: bool = False  # placed on cpu devices
    cores: tuple[tuple[int, ...], ...] | None = None  # cpu devices: each device's cores

    def parallel(self, family: EngineFamily, tensor_flag: str, stages_flag: str) -> list[str]:
        """The tensor width, the pipeline stages (above 1) and, for a rank of a group of
        nodes, the family's multi-node flags (:meth:`EngineFamily.rank_args`)."""
        options = self.options
        args = [tensor_flag, str(options.tensor_width)]
        if options.stages > 1:
            args += [stages_flag, str(options.stages)]
        if self.group is not None:
            args += family.rank_args(self.group)
        return args

    def command(self, family: EngineFamily) -> list[str]:
        """The family's command for this load (:meth:`EngineFamily.command`): headless on a
        rank >= 1 of a group of nodes."""
        headless = self.group is not None and not self.group.leads
        return family.command(self.settings, headless=headless)

    def model_source(self, flag: str) -> list[str]:
        """``flag <path>`` (the local folder, else the hub id), and ``--revision`` for a hub id."""
        args = [flag, self.options.model_path or self.served.config.hf_id]
        revision = self.served.revision
        if revision and not self.options.model_path:
            args += ["--revision", str(revision)]
        return args

    @property
    def fraction(self) -> float | None:
        """The engine's memory flag (its share), when the worker knows device memory."""
        return self.share.fraction if self.share is not None else None

    @property
    def precision(self) -> str | None:
        """``compute_precision``, the load-time option's over the profile's."""
        profile = self.served.profile
        value = profile.loadtime.get("compute_precision", profile.compute_precision)
        return str(value) if value else None
