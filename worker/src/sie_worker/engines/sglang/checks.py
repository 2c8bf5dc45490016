"""Load-time checks of an SGLang adapter's options against the engine's SGLang release.

The release is the worker's bundle's (``SIE_BUNDLE``; ``SIE_SGLANG_VERSION`` overrides it),
with its option table when one ships. Beyond each option's own rule
(:mod:`sie_worker.engines.sglang.flags`):

- an adapter that needs a newer engine than the release (SIE's Gemma and cu130 adapters:
  SGLang 0.5.20 and later), or a flag the release lacks (``--enable-strict-thinking``), is
  refused on that bundle, naming the bundle that runs it;
- ``json_number_max_digits`` needs ``grammar_backend: xgrammar``; ``thinking_budget`` needs a
  ``reasoning_parser`` of qwen3 or gemma4 (SIE's rules);
- speculative decoding needs the release's mamba radix-cache strategy set to
  ``extra_buffer`` in ``extra_launch_args`` unless ``speculative_needs_extra_buffer: false``
  (SIE refuses the launch otherwise);
- every ``--flag`` in ``extra_launch_args`` is one the release has (a unique prefix counts,
  as in SGLang), else refused with the closest spelling; ``--lora-paths``, ``--enable-lora``
  and ``--max-loras-per-batch`` are refused there (``loadtime.lora_paths`` declares adapters),
  and a ``--max-loaded-loras`` below the adapters or ``max_loras_per_batch`` (SGLang's rule).

Hook options (SIE's own engine code) are accepted and reported as warnings.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sie_server.adapters.base import Adapter
from sie_worker.config.flags.option_tables import (
    OptionTable,
    flag_value,
    resolve,
    table_for,
    unknown_option,
)
from sie_worker.config.lora import lora_adapters, max_loras
from sie_worker.config.model import JsonPath, ServedModel
from sie_worker.engines.sglang.flags import SGLANG_OPTIONS, Release, option_problem
from sie_worker.engines.sglang.release import BUNDLE_VERSIONS, engine_version, version_key

__all__ = ["MAMBA_DESTS", "SGLangChecks", "mamba_strategy", "release_of"]

# The release's name for the mamba radix-cache strategy (renamed in SGLang 0.5.20).
MAMBA_DESTS = ("mamba_radix_cache_strategy", "mamba_scheduler_strategy")
_CHECKED_BY_RESOLVER = frozenset(
    {
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "request_read_timeout_s",
        "startup_timeout_s",
        "watchdog_timeout_s",
        "disable_piecewise_cuda_graph",
        "nccl_port",
        "disable_cuda_graph",
    }
)
_THINKING_PARSERS = ("qwen3", "gemma4")
# What loadtime.lora_paths and max_loras_per_batch set; other LoRA flags (rank, target
# modules, backend) may be passed in extra_launch_args.
_LORA_DESTS = frozenset({"lora_paths", "enable_lora", "max_loras_per_batch"})

Where = str | JsonPath


def release_of(bundle: str, env: Mapping[str, str] | None) -> Release:
    version = engine_version(bundle, env)
    return Release(version, bundle, table_for(version))


def mamba_strategy(args: tuple[str, ...], table: OptionTable) -> tuple[str | None, str | None]:
    """``(flag, value)`` of the last mamba radix-cache strategy setting in ``args``, two-token
    or ``--flag=value`` (the release's spelling of the flag; value None when unset)."""
    flag = next((s for d in MAMBA_DESTS for s in table.strings_of(d)), None)
    return flag, flag_value(args, MAMBA_DESTS, table)


class SGLangChecks:
    def __init__(
        self,
        adapter: type[Adapter],
        served: ServedModel,
        loadtime: Mapping[str, Any],
        release: Release,
    ) -> None:
        self.adapter = adapter
        self.served = served
        self.loadtime = loadtime
        self.release = release
        self.warnings: list[str] = []
        self._base: JsonPath = (
            "profiles",
            served.profile.loadtime_from,
            "adapter_options",
            "loadtime",
        )

    def problems(self) -> list[tuple[Where, str]]:
        found = self._engine() + self._options() + self._pairs() + self._speculative()
        return found + self._extra_args() + self._loaded_loras()

    def _engine(self) -> list[tuple[Where, str]]:
        adapter, release = self.adapter, self.release
        where: JsonPath = ("profiles", self.served.profile.name, "adapter_path")
        minimum = adapter.min_sglang
        able = [
            b
            for b, v in BUNDLE_VERSIONS.items()
            if not minimum or version_key(v) >= version_key(minimum)
        ]
        if minimum and version_key(release.version) < version_key(minimum):
            return [
                (
                    where,
                    f"{adapter.__name__} needs SGLang {minimum} or later (SIE serves it from its "
                    f"{adapter.bundle} bundle), and this worker runs {release.name}: serve it "
                    f"from a pool with the {' or '.join(able)} bundle",
                )
            ]
        table = release.table
        missing = [f for f in adapter.added_flags if table and not table.has(f)]
        return [
            (
                where,
                f"{adapter.__name__} passes {flag}, which {release.name} lacks: serve it from a "
                f"pool with the {adapter.bundle} bundle",
            )
            for flag in missing
        ]

    def _options(self) -> list[tuple[Where, str]]:
        found: list[tuple[Where, str]] = []
        for name, value in self.loadtime.items():
            option = SGLANG_OPTIONS.get(name)
            if option is None or name in _CHECKED_BY_RESOLVER:
                continue
            message = option_problem(name, value, self.release)
            if message is not None:
                found.append((name, message))
            elif option.applied == "hook":
                from sie_worker.config.files.jsonpath import json_path

                self.warnings.append(
                    f"{json_path([*self._base, name])}: accepted but not applied by this worker: "
                    f"{option.meaning}"
                )
        return found

    def _pairs(self) -> list[tuple[Where, str]]:
        loadtime = self.loadtime
        found: list[tuple[Where, str]] = []
        parser = loadtime.get("reasoning_parser")
        if "json_number_max_digits" in loadtime and loadtime.get("grammar_backend") != "xgrammar":
            found.append(
                (
                    "json_number_max_digits",
                    "needs grammar_backend: xgrammar (the bound is applied to XGrammar's JSON "
                    f"compiler), got grammar_backend {loadtime.get('grammar_backend')!r}",
                )
            )
        if "thinking_budget" in loadtime and parser not in _THINKING_PARSERS:
            found.append(
                (
                    "thinking_budget",
                    "needs reasoning_parser qwen3 or gemma4 (the parsers whose thinking markers "
                    f"are known), got {parser!r}",
                )
            )
        return found

    def _speculative(self) -> list[tuple[Where, str]]:
        spec = self.loadtime.get("speculative")
        table = self.release.table
        if not (isinstance(spec, dict) and spec.get("enabled") is True) or table is None:
            return []
        if self.loadtime.get("speculative_needs_extra_buffer", True) is False:
            return []
        flag, value = mamba_strategy(self.served.profile.extra_launch_args, table)
        if value == "extra_buffer" or flag is None:
            return []
        return [
            (
                "speculative",
                f"speculative decoding needs '{flag} extra_buffer' in extra_launch_args on "
                f"{self.release.name} (hybrid Gated-DeltaNet models lose the radix cache "
                "without it): add it, set speculative_needs_extra_buffer: false for a model "
                "without such layers (e.g. Gemma 4), or set speculative.enabled: false",
            )
        ]

    def _loaded_loras(self) -> list[tuple[Where, str]]:
        """SGLang's own limits with ``--max-loaded-loras N`` in extra_launch_args: at least
        max_loras_per_batch, and at least the adapters declared (else the engine exits)."""
        table, args = self.release.table, self.served.profile.extra_launch_args
        if table is None or "lora_paths" not in self.loadtime:
            return []
        raw = flag_value(args, {"max_loaded_loras"}, table)
        loaded = int(raw) if raw is not None and raw.isdigit() else None
        if loaded is None:
            return []
        count = len(lora_adapters(self.loadtime))
        batch = max_loras(self.loadtime, self.adapter.task(self.served.config.tasks))
        if loaded >= max(count, batch):
            return []
        return [
            (
                "lora_paths",
                f"declares {count} adapter(s) with max_loras_per_batch {batch}, and "
                f"--max-loaded-loras {loaded} in extra_launch_args is below "
                f"{'the adapters' if count > batch else 'max_loras_per_batch'} (SGLang refuses "
                f"to start): raise --max-loaded-loras to {max(count, batch)}, or remove it",
            )
        ]

    def _extra_args(self) -> list[tuple[Where, str]]:
        table, profile = self.release.table, self.served.profile
        if table is None:
            return []
        found: list[tuple[Where, str]] = []
        for index, token in enumerate(profile.extra_launch_args):
            if not token.startswith("--") or token == "--":
                continue
            match = resolve(token, table)
            where: JsonPath = (*profile.launch_args_path, index)
            option = token.split("=", 1)[0]
            if match.ambiguous:
                found.append(
                    (
                        where,
                        f"{token!r} is an ambiguous abbreviation in {self.release.name}: it "
                        f"could be {', '.join(match.candidates)}; spell out the option you mean",
                    )
                )
            elif match.dest in _LORA_DESTS:
                found.append(
                    (
                        where,
                        f"{option} sets LoRA adapters behind the worker's back: declare them in "
                        "loadtime.lora_paths (and max_loras_per_batch), so requests can name "
                        "them and /v1/models lists them",
                    )
                )
            elif not match.candidates:
                found.append((where, unknown_option(option, table, self.release.name)))
        return found
