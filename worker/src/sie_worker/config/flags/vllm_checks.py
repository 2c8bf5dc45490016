"""Load-time checks of a vLLM adapter's options against the engine's vLLM release.

The release is the worker's bundle's (``SIE_BUNDLE``; ``SIE_VLLM_VERSION`` overrides it),
with its option table (vLLM's own parser, :mod:`sie_worker.config.flags.option_tables`). Beyond
each option's own rule (:mod:`sie_worker.config.flags.vllm_flags`), every ``extra_launch_args``
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
from sie_worker.config.flags.vllm_flags import VLLM_OPTIONS, option_problem
from sie_worker.config.flags.vllm_release import engine_version
from sie_worker.config.model import JsonPath, ServedModel

__all__ = ["VLLMChecks", "vllm_release_of"]

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


def vllm_release_of(bundle: str, env: Mapping[str, str]) -> Release:
    version = engine_version(bundle, env)
    return Release(version, bundle, table_for(version, "vllm"), "vLLM")


class VLLMChecks:
    def __init__(self, served: ServedModel, loadtime: Mapping[str, Any], release: Release) -> None:
        self.served = served
        self.loadtime = loadtime
        self.release = release
        self.warnings: list[str] = []

    def problems(self) -> list[tuple[Where, str]]:
        return self._options() + self._extra_args()

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
