"""Load-time options: what each adapter accepts, their defaults, and the load-time rules.

Applied when a model loads, by ``sie-worker plan`` and by ``sie-worker validate --devices``.
Every refusal is an :class:`~sie_worker.errors.InvalidConfig` listing all problems at once.

Defaults: ``tensor_parallel_size`` 1; ``request_read_timeout_s`` generation:
``SIE_SGLANG_GENERATE_READ_TIMEOUT_S`` or none, embedding: 60; ``startup_timeout_s``
``SIE_MODEL_READY_TIMEOUT_S`` or 900; ``watchdog_timeout_s`` the engine's;
``disable_piecewise_cuda_graph`` true above width 1 (every width on ``sglang-cu130``);
``nccl_port`` picked by the worker from 30400-30499.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from sie_server.adapters.base import Adapter
from sie_server.adapters.sglang import SGLANG_LOADTIME_OPTIONS
from sie_worker.config.adapters import UnknownAdapter, default_adapter_path, resolve_adapter
from sie_worker.config.jsonpath import json_path
from sie_worker.config.model import ServedModel
from sie_worker.config.model_shape import (
    ModelPathError,
    head_counts,
    local_model_dir,
    width_fit_problems,
)
from sie_worker.config.rules import width_problem
from sie_worker.config.schema import type_name
from sie_worker.config.sglang_options import disables_cuda_graph
from sie_worker.errors import InvalidConfig, Problem
from sie_worker.settings import Settings

__all__ = [
    "CU130_BUNDLE",
    "DEFAULT_STARTUP_TIMEOUT_S",
    "EMBEDDING_READ_TIMEOUT_S",
    "LoadOptions",
    "adapter_of",
    "declared_width",
    "resolve_load_options",
]

DEFAULT_STARTUP_TIMEOUT_S = 900.0
EMBEDDING_READ_TIMEOUT_S = 60.0
CU130_BUNDLE = "sglang-cu130"
# Options that LoadOptions carries as fields; any other accepted option goes to ``extras``.
_COMMON = frozenset(SGLANG_LOADTIME_OPTIONS)
_DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class LoadOptions:
    width: int
    request_read_timeout_s: float | None
    startup_timeout_s: float
    watchdog_timeout_s: float | None
    disable_piecewise_cuda_graph: bool
    nccl_port: int | None  # declared; None -> worker picks from 30400-30499
    extras: Mapping[str, Any]  # adapter-specific accepted options (chat_template, threads, ...)
    disable_cuda_graph: bool = False  # loadtime option, or --disable-cuda-graph in extra args
    adapter: str = ""  # the resolved adapter_path (bundle default applied)
    task: str | None = None  # "generate" or "encode"
    declared: Mapping[str, Any] = field(default_factory=dict)  # the loadtime block as written
    model_path: str | None = None  # model_path resolved to a local directory; None: use hf_id


def adapter_of(served: ServedModel, settings: Settings) -> type[Adapter]:
    """The profile's adapter, or the bundle's default one. Raises :class:`UnknownAdapter`."""
    path = served.profile.adapter_path or default_adapter_path(
        settings.has_sglang_bundle, served.config.tasks
    )
    return resolve_adapter(path)


def declared_width(served: ServedModel) -> int:
    """The width the profile declares (1 when absent or invalid); no load-time checks."""
    value = served.profile.loadtime.get("tensor_parallel_size", 1)
    return value if width_problem(value) is None else 1


def resolve_load_options(
    served: ServedModel, settings: Settings, *, env: Mapping[str, str] | None = None
) -> LoadOptions:
    """Check the profile's load-time options for this worker and fill in the defaults.

    ``env`` is where the Hugging Face cache is looked up (default: the process environment).
    Raises :class:`InvalidConfig` naming every problem.
    """
    return _Resolver(served, settings, os.environ if env is None else env).resolve()


class _Resolver:
    def __init__(self, served: ServedModel, settings: Settings, env: Mapping[str, str]) -> None:
        self.served = served
        self.settings = settings
        self.env = env
        self.loadtime: Mapping[str, Any] = served.profile.loadtime
        self.base = ["profiles", served.profile.loadtime_from, "adapter_options", "loadtime"]
        self.problems: list[Problem] = []

    def add(self, where: str | list[str | int], message: str) -> None:
        path = json_path([*self.base, where]) if isinstance(where, str) else json_path(where)
        self.problems.append(Problem(path, message, self.served.config.source))

    def resolve(self) -> LoadOptions:
        served, settings, loadtime = self.served, self.settings, self.loadtime
        try:
            adapter = adapter_of(served, settings)
        except UnknownAdapter as exc:
            self.add(["profiles", served.profile.name, "adapter_path"], str(exc))
            raise InvalidConfig(self.problems) from None
        self._unknown_options(adapter)
        # Refused keys are reported once, as unknown; only accepted ones get value checks.
        self.loadtime = loadtime = {
            k: v for k, v in loadtime.items() if k in adapter.loadtime_options
        }
        task = self._task(adapter)
        width = self._width(adapter)
        generation = task == "generate"
        if "request_read_timeout_s" in loadtime:
            read_timeout = self._seconds("request_read_timeout_s")
        elif task == "encode":
            read_timeout = EMBEDDING_READ_TIMEOUT_S
        else:
            read_timeout = settings.generate_read_timeout_s
        startup = self._startup(width, generation)
        if generation and width > 1 and read_timeout is None:
            self.add(
                "request_read_timeout_s",
                f"is required for generation above width 1 (tensor_parallel_size {width}) "
                "when SIE_SGLANG_GENERATE_READ_TIMEOUT_S is unset: a stalled GPU group sends "
                "no bytes and raises no error; set a read cap in seconds, e.g. 600",
            )
        watchdog = self._seconds("watchdog_timeout_s")
        piecewise = self._bool("disable_piecewise_cuda_graph")
        if piecewise is None:
            piecewise = width > 1 or settings.bundle == CU130_BUNDLE
        no_graphs = bool(self._bool("disable_cuda_graph")) or (
            adapter.engine == "sglang" and disables_cuda_graph(served.profile.extra_launch_args)
        )
        nccl_port = self._nccl_port(width)
        extras = self._extras(adapter)
        model_path = self._shape(width, adapter)
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
        )

    # --- one check each ------------------------------------------------------------------

    def _unknown_options(self, adapter: type[Adapter]) -> None:
        accepted = adapter.loadtime_options
        name = adapter.__name__
        for key in self.loadtime:
            if key in accepted:
                continue
            if key == "tensor_parallel_size":
                self.add(
                    key,
                    f"{name} runs on one device; only the SGLang adapters accept "
                    "tensor_parallel_size: remove it, or serve the model with "
                    "sie_server.adapters.sglang.generation:SGLangGenerationAdapter",
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

    def _width(self, adapter: type[Adapter]) -> int:
        if "tensor_parallel_size" not in adapter.loadtime_options:
            return 1
        value = self.loadtime.get("tensor_parallel_size", 1)
        message = width_problem(value)
        if message is not None:
            self.add("tensor_parallel_size", message)
            return 1
        assert isinstance(value, int)
        devices = self.settings.devices
        if value > len(devices):
            self.add(
                "tensor_parallel_size",
                f"{value} needs {value} GPUs but this worker has {len(devices)} device(s) "
                f"({','.join(devices)}, from SIE_DEVICES): lower it, or serve the model from a "
                f"pool with gpu.deviceGroup: true and gpu.count of at least {value}",
            )
        return value

    def _seconds(self, key: str) -> float | None:
        if key not in self.loadtime:
            return None
        value = self.loadtime[key]
        expected = "must be a finite number of seconds above zero"
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.add(key, f"{expected}, got {type_name(value)} {_shown(value)}".rstrip())
            return None
        try:
            seconds = float(value)
        except OverflowError:
            self.add(key, f"{expected}, got a number too large to be a duration")
            return None
        if not math.isfinite(seconds) or seconds <= 0:
            self.add(key, f"{expected}, got {_shown(value)}")
            return None
        return seconds

    def _startup(self, width: int, generation: bool) -> float:
        settings = self.settings
        declared = "startup_timeout_s" in self.loadtime
        value = self._seconds("startup_timeout_s")
        if generation and width > 1 and not declared:
            self.add(
                "startup_timeout_s",
                f"is required for generation above width 1 (tensor_parallel_size {width}), "
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
                f"the worker's liveness budget of {_num(budget)} s (SIE_WORKER_LIVENESS_BUDGET_S)"
            )
            if declared:
                self.add(
                    "startup_timeout_s",
                    f"{_num(value)} is at or above {limit}: lower it below {_num(budget)}, "
                    "or raise the liveness probe's budget",
                )
            else:
                source = (
                    f"SIE_MODEL_READY_TIMEOUT_S={_num(value)}"
                    if settings.model_ready_timeout_s
                    else f"the built-in {_num(value)} s (SIE_MODEL_READY_TIMEOUT_S is unset)"
                )
                self.add(
                    "startup_timeout_s",
                    f"is not declared and its default, {source}, is at or above {limit}: set "
                    f"SIE_MODEL_READY_TIMEOUT_S (workers.common.modelReadyTimeoutSec) below "
                    f"{_num(budget)}, or declare a lower startup_timeout_s",
                )
        return value

    def _bool(self, key: str) -> bool | None:
        if key not in self.loadtime:
            return None
        value = self.loadtime[key]
        if not isinstance(value, bool):
            self.add(key, f"must be true or false, got {type_name(value)} {_shown(value)}".rstrip())
            return None
        return value

    def _nccl_port(self, width: int) -> int | None:
        if "nccl_port" not in self.loadtime:
            return None
        value = self.loadtime["nccl_port"]
        if isinstance(value, bool) or not isinstance(value, int) or not 1024 <= value <= 65535:
            got = f"{type_name(value)} {_shown(value)}".rstrip()
            self.add("nccl_port", f"must be an integer from 1024 to 65535, got {got}")
            return None
        if width <= 1:
            self.add(
                "nccl_port",
                "is only allowed above width 1 (tensor_parallel_size is 1): remove it, or "
                "raise tensor_parallel_size",
            )
            return None
        return value

    def _extras(self, adapter: type[Adapter]) -> dict[str, Any]:
        extras = {k: v for k, v in self.loadtime.items() if k not in _COMMON}
        extras = {k: v for k, v in extras.items() if k in adapter.loadtime_options}
        if "chat_template" in extras:
            value = extras["chat_template"]
            if not isinstance(value, str) or not value.strip():
                self.add(
                    "chat_template",
                    "must be an SGLang built-in template name (e.g. chatml) or a template "
                    f"file path, got {type_name(value)} {_shown(value)}".rstrip(),
                )
        if "device" in extras and extras["device"] not in _DEVICES:
            got = extras["device"]
            self.add("device", f"must be one of {', '.join(_DEVICES)}, got {_shown(got)}")
        for key in ("threads", "max_batch_size"):
            if key in extras:
                value = extras[key]
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    got = f"{type_name(value)} {_shown(value)}".rstrip()
                    self.add(key, f"must be an integer of at least 1, got {got}")
        return extras

    def _shape(self, width: int, adapter: type[Adapter]) -> Path | None:
        """The local model directory (None: hf_id), and the head-count rule above width 1."""
        try:
            local = local_model_dir(self.served.config)
            counts = head_counts(self.served.config, self.env) if width > 1 else None
        except ModelPathError as exc:
            self.add(["model_path"], str(exc))
            return None
        if counts is not None and adapter.engine == "sglang":
            for message in width_fit_problems(width, counts):
                self.add("tensor_parallel_size", message)
        return local


def _shown(value: object) -> str:
    """The value as a config would spell it, for messages (``type_name`` says null)."""
    if value is None or isinstance(value, dict | list):
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    text = repr(value)
    if isinstance(value, int) and len(text) > 20:
        return "(a very large number)"
    if isinstance(value, str):
        hint = "; write it without quotes" if _numeric(value) else ""
        return (text if len(text) <= 60 else text[:57] + "...") + hint
    return text if len(text) <= 60 else text[:57] + "..."


def _numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)
