"""Load-time checks of a vLLM adapter's options against the engine's vLLM release.

The release is the worker's bundle's (``SIE_BUNDLE``; ``SIE_VLLM_VERSION`` overrides it),
with its option table (vLLM's own parser, :mod:`sie_worker.config.flags.option_tables`). Beyond
each option's own rule (:mod:`sie_worker.engines.vllm.flags`), every ``extra_launch_args``
token is read as vLLM's FlexibleArgumentParser reads it (underscores, ``--name.key``,
abbreviations, short aliases):

- a reserved flag is refused (:mod:`sie_worker.config.flags.reserved_flags`, vLLM's reasons);
- ``--enable-lora``, ``--lora-modules`` and ``--max-loras`` are refused (``loadtime.lora_paths``
  declares adapters, so requests can name them and ``/v1/models`` lists them), and
  ``--gpu-memory-utilization`` (``loadtime.gpu_memory_utilization``: the worker reserves that
  share of each device, so it must know it);
- every other ``--flag`` is one the release has (a unique prefix counts, as in vLLM), else
  refused with the closest spelling.

A value vLLM's parser refuses (``--max-num-seqs many``) is not checked here: the engine then
exits at start and the load fails with vLLM's own message.

Pipeline stages on cpu devices: vLLM's CPU build skips its warm-up in compilation mode NONE
(upstream PR #50547), and the warm-up is what creates the buffer later stages receive into,
so a pipelined engine in that mode reports ready and then fails its first request
(``assert self.intermediate_tensors is not None``). The launcher gives such an engine a mode
that warms up (:data:`PIPELINE_ON_CPU_COMPILATION`); what would force mode NONE is refused at
load, naming it: ``enforce_eager: true``, ``lora_paths`` (LoRA forces the mode on CPU), and
``--enforce-eager``, ``--compilation-config``/``-cc`` or ``-O`` in ``extra_launch_args``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sie_worker.config.flags.option_rules import Release
from sie_worker.config.flags.option_tables import (
    flexible_option,
    resolve,
    table_for,
    unknown_option,
)
from sie_worker.config.flags.reserved_flags import reserved_flag_problem
from sie_worker.config.model import JsonPath, ServedModel
from sie_worker.engines.vllm.flags import VLLM_OPTIONS, option_problem
from sie_worker.engines.vllm.release import engine_version

__all__ = ["PIPELINE_ON_CPU_COMPILATION", "VLLMChecks", "vllm_release_of"]

# Traced, not compiled: the warm-up runs (about 3 s for a small model) and no compiler is
# needed. What the launcher passes a vLLM engine of pipeline stages on cpu devices.
PIPELINE_ON_CPU_COMPILATION = '{"mode": 2, "backend": "eager"}'
# dests of extra_launch_args that would set the compilation mode the worker sets.
_COMPILATION_DESTS = frozenset({"enforce_eager", "compilation_config", "optimization_level"})

# Checked by the resolver itself (width, timeouts, the rendezvous port).
_CHECKED_BY_RESOLVER = frozenset(
    {
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "request_read_timeout_s",
        "startup_timeout_s",
        "nccl_port",
    }
)
# dest -> the load-time option that sets it instead.
_OWNED: Mapping[str, str] = {
    "enable_lora": "lora_paths",
    "lora_modules": "lora_paths",
    "max_loras": "max_loras_per_batch",
    "gpu_memory_utilization": "gpu_memory_utilization",
}

Where = str | JsonPath


def vllm_release_of(bundle: str, env: Mapping[str, str] | None) -> Release:
    version = engine_version(bundle, env)
    return Release(version, bundle, table_for(version, "vllm"), "vLLM")


class VLLMChecks:
    def __init__(
        self,
        served: ServedModel,
        loadtime: Mapping[str, Any],
        release: Release,
        *,
        on_cpu: bool = False,
    ) -> None:
        self.served = served
        self.loadtime = loadtime
        self.release = release
        self.warnings: list[str] = []
        stages = loadtime.get("pipeline_parallel_size", 1)
        # The stages of a pipelined engine on cpu devices (0: none; see the module docstring).
        self._cpu_stages = (
            stages if on_cpu and isinstance(stages, int) and not isinstance(stages, bool) else 0
        )
        if self._cpu_stages < 2:
            self._cpu_stages = 0

    def problems(self) -> list[tuple[Where, str]]:
        return self._options() + self._extra_args() + self._pipeline_on_cpu()

    def _pipeline_on_cpu(self) -> list[tuple[Where, str]]:
        """What would force compilation mode NONE on a pipelined engine on cpu devices."""
        stages = self._cpu_stages
        if not stages:
            return []
        why = (
            f"with pipeline_parallel_size {stages} on cpu devices: vLLM's CPU build skips its "
            "warm-up in compilation mode NONE, and its later pipeline stages then fail on their "
            "first request"
        )
        found: list[tuple[Where, str]] = []
        if self.loadtime.get("enforce_eager") is True:
            found.append(
                (
                    "enforce_eager",
                    f"true is refused {why}; drop it (the worker runs such an engine traced, "
                    f"not compiled: --compilation-config '{PIPELINE_ON_CPU_COMPILATION}'), or "
                    "set pipeline_parallel_size: 1",
                )
            )
        if self.loadtime.get("lora_paths"):
            found.append(
                (
                    "lora_paths",
                    f"is refused {why} (LoRA forces that mode on CPU); serve the adapters at "
                    "pipeline_parallel_size: 1, or on cuda devices",
                )
            )
        table, profile = self.release.table, self.served.profile
        if table is None:
            return found
        for index, token in enumerate(profile.extra_launch_args):
            if resolve(token, table).dest in _COMPILATION_DESTS:
                found.append(
                    (
                        (*profile.launch_args_path, index),
                        f"{token!r} is refused {why}: the worker sets the compilation mode of "
                        f"such an engine (--compilation-config '{PIPELINE_ON_CPU_COMPILATION}'); "
                        "remove it",
                    )
                )
        return found

    def _options(self) -> list[tuple[Where, str]]:
        found: list[tuple[Where, str]] = []
        for name, value in self.loadtime.items():
            if name not in VLLM_OPTIONS or name in _CHECKED_BY_RESOLVER:
                continue
            message = option_problem(name, value, self.release)
            if message is not None:
                found.append((name, message))
        return found

    def _extra_args(self) -> list[tuple[Where, str]]:
        table, profile = self.release.table, self.served.profile
        if table is None:
            return []
        found: list[tuple[Where, str]] = []
        for index, token in enumerate(profile.extra_launch_args):
            where: JsonPath = (*profile.launch_args_path, index)
            reserved = reserved_flag_problem(token, (table,))
            if reserved is not None:
                found.append((where, reserved))
                continue
            if not token.startswith("--") or token == "--":
                continue  # a value, or a short alias (reserved ones are refused above)
            match = resolve(token, table)
            option = flexible_option(token).split("=", 1)[0]
            if match.ambiguous:
                found.append(
                    (
                        where,
                        f"{token!r} is an ambiguous abbreviation in {self.release.name}: it "
                        f"could be {', '.join(match.candidates)}; spell out the option you mean",
                    )
                )
            elif match.dest is not None and match.dest in _OWNED:
                setting = _OWNED[match.dest]
                found.append(
                    (
                        where,
                        f"{option} is set by the worker from loadtime.{setting}: declare it "
                        f"there instead (the worker reserves device memory and lists LoRA "
                        "adapters from the load-time options)",
                    )
                )
            elif not match.candidates:
                found.append((where, unknown_option(option, table, self.release.name)))
        return found
