"""What every engine's command line is built from (:class:`ArgvInputs`), and the pieces the
engines' argv builders share. Pure."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from sie_worker.config.engine_families import EngineFamily
from sie_worker.config.load.load_options import LoadOptions
from sie_worker.config.model import ServedModel
from sie_worker.settings import Settings

__all__ = ["ENGINE_HOST", "ArgvInputs"]

ENGINE_HOST = "127.0.0.1"


@dataclass(frozen=True)
class ArgvInputs:
    """One load's command-line inputs: the model, its checked options, the engine's ports,
    the worker's settings, a release to build for instead of the checked one (tests, tools),
    and the engine's memory flag (its share; None: the declared option as it is)."""

    served: ServedModel
    options: LoadOptions
    port: int
    nccl_port: int | None
    settings: Settings
    version: str | None = None
    share: float | None = None

    def command(self, family: EngineFamily) -> list[str]:
        """The engine's command: its ``SIE_*_COMMAND`` prefix, else ``python -m <module>``."""
        override = {
            "SIE_SGLANG_COMMAND": self.settings.sglang_command,
            "SIE_VLLM_COMMAND": self.settings.vllm_command,
        }.get(family.command_variable or "")
        return list(override or (sys.executable, "-m", family.module))

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
