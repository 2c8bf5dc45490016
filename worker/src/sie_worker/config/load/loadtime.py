"""Load-time options: what each adapter accepts, their defaults, and the load-time rules.

Applied when a model loads, by ``sie-worker plan`` and by ``sie-worker validate --devices``.
Every refusal is an :class:`~sie_worker.errors.InvalidConfig` listing all problems at once.

Defaults: ``tensor_parallel_size`` 1, ``pipeline_parallel_size`` 1 (the width is their
product; a model wider than the worker is served by its group of nodes, pinned, width /
``SIE_NODES`` devices on each rank); ``request_read_timeout_s`` generation:
``SIE_SGLANG_GENERATE_READ_TIMEOUT_S`` or none, embedding: 60; ``startup_timeout_s``
``SIE_MODEL_READY_TIMEOUT_S`` or 900; ``watchdog_timeout_s`` the engine's;
``disable_piecewise_cuda_graph`` true above width 1 (every width on ``sglang-cu130`` and with SIE's
Gemma and cu130 adapters);
``nccl_port`` picked by the worker from 30400-30499. The SGLang adapters' other options, the
flag each means and its rule are one table, :mod:`sie_worker.engines.sglang.flags`, checked
against the SGLang release of the worker's bundle; the transformers engine's options are
checked in :mod:`sie_worker.engines.default.checks`.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from sie_server.adapters.base import Adapter
from sie_worker.config.adapters import (
    NotServedHere,
    UnknownAdapter,
)
from sie_worker.config.files.jsonpath import json_path
from sie_worker.config.files.values import number_text
from sie_worker.config.flags.option_rules import Release
from sie_worker.config.load.load_options import LoadOptions, adapter_of, context_length
from sie_worker.config.load.model_shape import (
    ModelPathError,
    head_counts,
    local_model_dir,
    width_fit_problems,
)
from sie_worker.config.lora import LoraAdapter, load_adapters, max_loras
from sie_worker.config.model import JsonPath, ServedModel
from sie_worker.config.widths import (
    group_width_problem,
    model_width,
    rank_width,
    stages_problem,
    width_fits,
    width_problem,
    width_words,
)
from sie_worker.engines.family import EngineChecks
from sie_worker.engines.registry import family_of
from sie_worker.engines.sglang.flags import option_problem
from sie_worker.errors import InvalidConfig, Problem
from sie_worker.settings import Settings

__all__ = [
    "CU130_BUNDLE",
    "DEFAULT_STARTUP_TIMEOUT_S",
    "EMBEDDING_READ_TIMEOUT_S",
    "resolve_load_options",
]

DEFAULT_STARTUP_TIMEOUT_S = 900.0
EMBEDDING_READ_TIMEOUT_S = 60.0
CU130_BUNDLE = "sglang-cu130"
# Options LoadOptions carries as fields (or the launcher reads from ``sglang``).
_COMMON = frozenset(
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


def resolve_load_options(
    served: ServedModel, settings: Settings, *, env: Mapping[str, str] | None = None
) -> LoadOptions:
    """Check the profile's load-time options for this worker and fill in the defaults.

    ``env`` is where the Hugging Face cache and ``SIE_SGLANG_VERSION`` are looked up
    (default: the process environment). Raises :class:`InvalidConfig` naming every problem.
    """
    return _Resolver(served, settings, os.environ if env is None else env).resolve()


class _Resolver:
    def __init__(self, served: ServedModel, settings: Settings, env: Mapping[str, str]) -> None:
        self.served = served
        self.settings = settings
        self.env = env
        self.loadtime: Mapping[str, Any] = served.profile.loadtime
        self.base: JsonPath = (
            "profiles",
            served.profile.loadtime_from,
            "adapter_options",
            "loadtime",
        )
        self.problems: list[Problem] = []
        self.warnings: list[str] = []

    def add(self, where: str | JsonPath | list[str | int], message: str) -> None:
        path = json_path([*self.base, where]) if isinstance(where, str) else json_path(where)
        self.problems.append(Problem(path, message, self.served.config.source))

    def resolve(self) -> LoadOptions:
        served, settings = self.served, self.settings
        try:
            adapter = adapter_of(served, settings)
        except (UnknownAdapter, NotServedHere) as exc:
            self.add(["profiles", served.profile.name, "adapter_path"], str(exc))
            raise InvalidConfig(self.problems) from None
        self._weights()
        self._unknown_options(adapter)
        # Refused keys are reported once, as unknown; only accepted ones get value checks.
        self.loadtime = loadtime = {
            k: v for k, v in self.loadtime.items() if k in adapter.loadtime_options
        }
        task = self._task(adapter)
        width, stages, local_width = self._width(adapter)
        spans = width_words(width, stages)
        generation = task == "generate"
        extras = {k: v for k, v in loadtime.items() if k not in _COMMON}
        claim = width if local_width is None else local_width
        release, checks = self._engine_checks(adapter, extras, claim)
        if "request_read_timeout_s" in loadtime:
            read_timeout = self._seconds("request_read_timeout_s")
        elif task == "encode":
            read_timeout = EMBEDDING_READ_TIMEOUT_S
        else:
            read_timeout = settings.generate_read_timeout_s
        startup = self._startup(width, generation, spans)
        if generation and width > 1 and read_timeout is None:
            self.add(
                "request_read_timeout_s",
                f"is required for generation above width 1 ({spans}) "
                "when SIE_SGLANG_GENERATE_READ_TIMEOUT_S is unset: a stalled GPU group sends "
                "no bytes and raises no error; set a read cap in seconds, e.g. 600",
            )
        watchdog = self._seconds("watchdog_timeout_s")
        piecewise = self._bool("disable_piecewise_cuda_graph")
        if piecewise is None:
            # SIE's Gemma and cu130 adapters turn it off at every width too.
            piecewise = width > 1 or CU130_BUNDLE in (settings.bundle, adapter.bundle)
        no_graphs = bool(self._bool("disable_cuda_graph")) or family_of(
            adapter.engine
        ).disables_graphs(served.profile.extra_launch_args)
        nccl_port = self._nccl_port(width)
        model_path = self._shape(width // stages, adapter)
        loras = self._loras()
        if self.problems:
            raise InvalidConfig(self.problems)
        return LoadOptions(
            width=width,
            request_read_timeout_s=read_timeout,
            startup_timeout_s=startup,
            watchdog_timeout_s=watchdog,
            disable_piecewise_cuda_graph=piecewise,
            nccl_port=nccl_port,
            extras=MappingProxyType(extras),
            disable_cuda_graph=no_graphs,
            adapter=adapter.adapter_path(),
            task=task,
            declared=served.profile.loadtime,
            model_path=str(model_path) if model_path is not None else None,
            engine_version=release.version if release else None,
            context_length=context_length(served, adapter),
            warnings=tuple(self.warnings + (checks.warnings if checks else [])),
            loras=loras,
            max_loras_per_batch=max_loras(loadtime, task) if loras else None,
            stages=stages,
            local_width=local_width,
        )

    # --- one check each ------------------------------------------------------------------

    def _weights(self) -> None:
        config = self.served.config
        for flag in ("package_backed", "remote_backed"):
            if getattr(config, flag):
                self.add(
                    [flag],
                    f"{flag} models have no weights the engines of this image can load; serve "
                    "the model with SIE's own image",
                )

    def _unknown_options(self, adapter: type[Adapter]) -> None:
        accepted = adapter.loadtime_options
        name = adapter.__name__
        for key in self.loadtime:
            if key in accepted:
                continue
            if key == "tensor_parallel_size":
                self.add(
                    key,
                    f"{name} runs on one device; only the SGLang and vLLM adapters accept "
                    "tensor_parallel_size: remove it, or serve the model with "
                    "sie_server.adapters.sglang.generation:SGLangGenerationAdapter (or "
                    "sie_server.adapters.vllm.generation:VLLMGenerationAdapter)",
                )
                continue
            close = difflib.get_close_matches(key, accepted, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]}?" if close else "accepted: " + ", ".join(accepted)
            self.add(key, f"is not a load-time option of {name}; {hint}")

    def _task(self, adapter: type[Adapter]) -> str | None:
        tasks = self.served.config.tasks
        task = adapter.task(tasks)
        name = adapter.__name__
        if task is None:
            self.add(
                ["tasks"],
                f"{name} serves one task, and this config declares {' and '.join(tasks)}: keep "
                "one, or serve the model with an SGLang adapter",
            )
        elif task not in tasks:
            self.add(
                ["tasks"],
                f"{name} serves {task}, which tasks does not declare: add tasks.{task}, or "
                "choose the adapter for " + " and ".join(tasks),
            )
        return task

    def _width(self, adapter: type[Adapter]) -> tuple[int, int, int | None]:
        """The model's width (tensor x stages), its stages and, for a model a group of nodes
        serves, the devices this rank claims (None: one worker serves it)."""
        if "tensor_parallel_size" not in adapter.loadtime_options:
            return 1, 1, None
        tensor = self._count("tensor_parallel_size", width_problem)
        stages = self._count("pipeline_parallel_size", stages_problem)
        width, settings = model_width(tensor, stages), self.settings
        devices, nodes = len(settings.devices), settings.nodes
        key = "tensor_parallel_size" if stages == 1 else "pipeline_parallel_size"
        message = group_width_problem(width, devices, nodes)
        if message is not None and nodes < 2 and stages == 1:
            message = (
                f"{width} needs {width} GPUs but this worker has {devices} device(s) "
                f"({','.join(settings.devices)}, from SIE_DEVICES): lower it, or serve the "
                f"model from a pool with gpu.deviceGroup: true and gpu.count of at least {width}"
            )
        if message is not None:
            self.add(key, message)
            return width, stages, None
        if width_fits(width, devices):
            return width, stages, None
        if self.served.id not in settings.pinned_models:
            self.add(
                key,
                f"width {width} is wider than this worker's {devices} device(s), so only the "
                f"group of SIE_NODES={nodes} nodes serves it, pinned on every rank: add "
                f"{self.served.id} to SIE_PINNED_MODELS",
            )
        return width, stages, rank_width(width, nodes)

    def _count(self, key: str, problem: Callable[[object], str | None]) -> int:
        value = self.loadtime.get(key, 1)
        message = problem(value)
        if message is not None:
            self.add(key, message)
            return 1
        assert isinstance(value, int)
        return value

    def _engine_checks(
        self, adapter: type[Adapter], extras: Mapping[str, Any], claim_width: int
    ) -> tuple[Release | None, EngineChecks | None]:
        """The engine release the load runs and its family's checks of the options."""
        family = family_of(adapter.engine)
        release = family.release(self.settings.bundle, self.env)
        on_cpu = not self.settings.devices[0].startswith("cuda")
        checks = family.checks(
            adapter,
            self.served,
            self.loadtime,
            release,
            on_cpu=on_cpu,
            claim_width=claim_width,
            extras=extras,
        )
        if checks is None:
            return release, None
        for where, message in checks.problems():
            self.add(where, message)
        return release, checks

    def _seconds(self, key: str) -> float | None:
        if key not in self.loadtime:
            return None
        message = option_problem(key, self.loadtime[key], _NO_RELEASE)
        if message is not None:
            self.add(key, message)
            return None
        return float(self.loadtime[key])

    def _startup(self, width: int, generation: bool, spans: str) -> float:
        settings = self.settings
        declared = "startup_timeout_s" in self.loadtime
        value = self._seconds("startup_timeout_s")
        if generation and width > 1 and not declared:
            self.add(
                "startup_timeout_s",
                f"is required for generation above width 1 ({spans}), "
                "even when SIE_MODEL_READY_TIMEOUT_S is set: declare the measured startup "
                "time including per-rank graph capture, e.g. 900",
            )
        if value is None:
            if declared:
                return DEFAULT_STARTUP_TIMEOUT_S  # refused above; any value will do
            value = settings.model_ready_timeout_s or DEFAULT_STARTUP_TIMEOUT_S
        budget = settings.liveness_budget_s
        if budget is not None and value >= budget:
            limit = (
                f"the worker's liveness budget of {number_text(budget)} s "
                "(SIE_WORKER_LIVENESS_BUDGET_S)"
            )
            if declared:
                self.add(
                    "startup_timeout_s",
                    f"{number_text(value)} is at or above {limit}: lower it below "
                    f"{number_text(budget)}, or raise the liveness probe's budget",
                )
            else:
                source = (
                    f"SIE_MODEL_READY_TIMEOUT_S={number_text(value)}"
                    if settings.model_ready_timeout_s
                    else f"the built-in {number_text(value)} s (SIE_MODEL_READY_TIMEOUT_S is unset)"
                )
                self.add(
                    "startup_timeout_s",
                    f"is not declared and its default, {source}, is at or above {limit}: set "
                    f"SIE_MODEL_READY_TIMEOUT_S (workers.common.modelReadyTimeoutSec) below "
                    f"{number_text(budget)}, or declare a lower startup_timeout_s",
                )
        return value

    def _bool(self, key: str) -> bool | None:
        if key not in self.loadtime:
            return None
        message = option_problem(key, self.loadtime[key], _NO_RELEASE)
        if message is not None:
            self.add(key, message)
            return None
        return bool(self.loadtime[key])

    def _nccl_port(self, width: int) -> int | None:
        if "nccl_port" not in self.loadtime:
            return None
        value = self.loadtime["nccl_port"]
        message = option_problem("nccl_port", value, _NO_RELEASE)
        if message is not None:
            self.add("nccl_port", message)
            return None
        if width <= 1:
            self.add(
                "nccl_port",
                "is only allowed above width 1 (tensor_parallel_size is 1): remove it, or "
                "raise tensor_parallel_size",
            )
            return None
        return int(value)

    def _loras(self) -> tuple[LoraAdapter, ...]:
        fetched = self.settings.weights_download == "worker"
        loras, problems, unpinned = load_adapters(
            self.loadtime, self.served.config.base_dir, fetched
        )
        for where, message in problems:
            self.add([*self.base, *where], message)
        for where, message in unpinned:
            self.warnings.append(f"{json_path([*self.base, *where])}: {message}")
        return loras

    def _shape(self, width: int, adapter: type[Adapter]) -> Path | None:
        """The local model directory (None: hf_id), and the head-count rule above width 1."""
        config = self.served.config
        try:
            local = local_model_dir(config)
            counts = head_counts(config, self.env) if width > 1 else None
        except ModelPathError as exc:
            self.add(list(config.path_of("model_path")), str(exc))
            return None
        if counts is not None and family_of(adapter.engine).checks_heads:
            for message in width_fit_problems(width, counts):
                self.add("tensor_parallel_size", message)
        return local


_NO_RELEASE = Release("", "", None)  # value rules that do not depend on the release
