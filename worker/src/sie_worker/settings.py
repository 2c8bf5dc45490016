"""Worker settings, read once from the environment: every ``SIE_*`` variable, its default
and its refusal (the README's variable table lists them)."""

from __future__ import annotations

import math
import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from sie_server.adapters.base import EngineKind
from sie_worker.devices import DeviceError, core_sets, gpu_visible, parse_devices
from sie_worker.engines.registry import FAMILIES, bundle_engine
from sie_worker.sizing.gpus import GpuError, parse_memory
from sie_worker.worker.placement.allocator import STRATEGIES, Strategy

__all__ = [
    "ConfigApiMode",
    "Settings",
    "SettingsError",
    "WeightsDownload",
    "env_int",
    "env_seconds",
    "split_address",
]

ConfigApiMode = Literal["read-write", "read-only", "disabled"]
_CONFIG_API_MODES: tuple[ConfigApiMode, ...] = ("read-write", "read-only", "disabled")
# Who fetches a hub model's weights: the worker (into HF_HOME, before the engine starts) or
# the engine itself from hf_id (ModelScope, custom loaders).
WeightsDownload = Literal["worker", "engine"]
_WEIGHTS_DOWNLOADS: tuple[WeightsDownload, ...] = ("worker", "engine")


class SettingsError(ValueError):
    """An environment variable has a value the worker cannot use; the message names it."""


@dataclass(frozen=True)
class Settings:
    devices: tuple[str, ...] = ("cpu",)
    # The cores of each device (devices.core_sets); () for cuda devices, and when unknown.
    device_cores: tuple[tuple[int, ...], ...] = ()
    bundle: str = "default"
    model_ready_timeout_s: float | None = None
    generate_read_timeout_s: float | None = None
    api_key: str | None = None
    # SIE_<ENGINE>_COMMAND prefixes, by variable (each family names its own:
    # EngineFamily.command_variable), split like shell lines.
    engine_commands: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    pinned_models: tuple[str, ...] = ()
    liveness_budget_s: float | None = None
    config_dir: Path | None = None
    config_api: ConfigApiMode = "read-write"
    max_body_bytes: int = 8 * 1024 * 1024
    drain_timeout_s: float = 30.0
    engine_stop_grace_s: float = 10.0
    weights_download: WeightsDownload = "worker"
    # Device memory (DESIGN "Device memory"): SIE's synthetic budget for every device (tests,
    # `plan`), the share of a device's total that models may reserve, and how width-1 models
    # are spread over devices.
    fake_memory_budget: int | None = None
    memory_pressure_threshold_percent: float = 95.0
    placement_strategy: Strategy = "spread"
    # A group of nodes (DESIGN "Pipeline parallelism and models beyond one node"): how many
    # workers serve the group's wide models together, this one's rank, rank 0's host.
    nodes: int = 1
    node_rank: int = 0
    leader_address: str | None = None
    # SIE_NODE_ADDRESSES: every rank's worker, rank 0 first ("host" or "host:port"; the port
    # defaults to this worker's): where a rank watches the others (worker/group_peers.py).
    node_addresses: tuple[str, ...] = ()
    host: str = "0.0.0.0"
    port: int = 8080
    extra: Mapping[str, str] = field(default_factory=dict)

    def cores_of(self, devices: tuple[str, ...]) -> tuple[tuple[int, ...], ...] | None:
        """The cores of each of ``devices`` when they are cpu devices with known cores."""
        if not self.device_cores or not all(d.startswith("cpu") for d in devices):
            return None
        cores = dict(zip(self.devices, self.device_cores, strict=True))
        found = tuple(cores.get(d, ()) for d in devices)
        return found if all(found) else None

    @property
    def engine(self) -> EngineKind:
        """The engine of the worker's bundle: the one a profile without ``adapter_path`` runs."""
        return bundle_engine(self.bundle)

    def with_overrides(self, **changes: object) -> Settings:
        return replace(self, **changes)  # type: ignore[arg-type]

    @classmethod
    def from_env(cls, env: Mapping[str, str], *, gpu: bool | None = None) -> Settings:
        """Read every ``SIE_*`` variable; raise :class:`SettingsError` naming a bad one."""
        try:
            devices = parse_devices(
                env.get("SIE_DEVICES"), gpu_visible=gpu_visible() if gpu is None else gpu
            )
            cores = core_sets(devices, os.sched_getaffinity(0))
        except DeviceError as exc:
            raise SettingsError(str(exc)) from exc
        mode = env.get("SIE_CONFIG_API", "read-write").strip().lower() or "read-write"
        if mode not in _CONFIG_API_MODES:
            raise SettingsError(
                f"SIE_CONFIG_API: {mode!r} is not one of {', '.join(_CONFIG_API_MODES)}"
            )
        config_dir = env.get("SIE_CONFIG_DIR", "").strip()
        weights = env.get("SIE_WEIGHTS_DOWNLOAD", "worker").strip().lower() or "worker"
        if weights not in _WEIGHTS_DOWNLOADS:
            raise SettingsError(
                f"SIE_WEIGHTS_DOWNLOAD: {weights!r} is not one of {', '.join(_WEIGHTS_DOWNLOADS)}"
            )
        strategy = env.get("SIE_PLACEMENT_STRATEGY", "spread").strip().lower() or "spread"
        if strategy not in STRATEGIES:
            raise SettingsError(
                f"SIE_PLACEMENT_STRATEGY: {strategy!r} is not one of {', '.join(STRATEGIES)}"
            )
        nodes, node_rank, leader = _node_group(env)
        return cls(
            devices=devices,
            device_cores=cores,
            bundle=env.get("SIE_BUNDLE", "default").strip() or "default",
            model_ready_timeout_s=env_seconds(env, "SIE_MODEL_READY_TIMEOUT_S"),
            generate_read_timeout_s=env_seconds(env, "SIE_SGLANG_GENERATE_READ_TIMEOUT_S"),
            api_key=env.get("SIE_API_KEY") or None,
            engine_commands=_engine_commands(env),
            pinned_models=tuple(
                dict.fromkeys(
                    m.strip() for m in env.get("SIE_PINNED_MODELS", "").split(",") if m.strip()
                )
            ),
            liveness_budget_s=env_seconds(env, "SIE_WORKER_LIVENESS_BUDGET_S"),
            config_dir=Path(config_dir) if config_dir else None,
            config_api=mode,
            max_body_bytes=env_int(env, "SIE_MAX_BODY_BYTES", 8 * 1024 * 1024),
            drain_timeout_s=env_seconds(env, "SIE_DRAIN_TIMEOUT_S") or 30.0,
            engine_stop_grace_s=env_seconds(env, "SIE_ENGINE_STOP_GRACE_S") or 10.0,
            weights_download=weights,
            fake_memory_budget=_memory_budget(env),
            memory_pressure_threshold_percent=_threshold(env),
            placement_strategy=strategy,
            nodes=nodes,
            node_rank=node_rank,
            leader_address=leader,
            node_addresses=_node_addresses(env, nodes),
        )


def _node_group(env: Mapping[str, str]) -> tuple[int, int, str | None]:
    """``SIE_NODES`` (N >= 2), ``SIE_NODE_RANK`` (0..N-1) and ``SIE_LEADER_ADDRESS`` (rank 0's
    host), all three or none (on a LeaderWorkerSet the chart maps LWS_GROUP_SIZE,
    LWS_WORKER_INDEX and LWS_LEADER_ADDRESS to them)."""
    names = ("SIE_NODES", "SIE_NODE_RANK", "SIE_LEADER_ADDRESS")
    raw = {name: env.get(name, "").strip() for name in names}
    if not any(raw.values()):
        return 1, 0, None
    missing = [name for name in names if not raw[name]]
    if missing:
        given = [name for name in names if raw[name]]
        verb = "is" if len(given) == 1 else "are"
        raise SettingsError(
            f"{missing[0]}: unset, but {' and '.join(given)} {verb} set; a group of nodes "
            "needs SIE_NODES, SIE_NODE_RANK and SIE_LEADER_ADDRESS together (unset them all "
            "for one node)"
        )
    try:
        nodes = int(raw["SIE_NODES"])
    except ValueError:
        nodes = 0
    if nodes < 2:
        raise SettingsError(
            f"SIE_NODES: must be an integer of at least 2 (the nodes of the group), got "
            f"{raw['SIE_NODES']!r}; unset SIE_NODES, SIE_NODE_RANK and SIE_LEADER_ADDRESS for "
            "one node"
        )
    try:
        rank = int(raw["SIE_NODE_RANK"])
    except ValueError:
        rank = -1
    if not 0 <= rank < nodes:
        raise SettingsError(
            f"SIE_NODE_RANK: must be an integer from 0 to {nodes - 1} (SIE_NODES={nodes}), "
            f"got {raw['SIE_NODE_RANK']!r}"
        )
    leader = raw["SIE_LEADER_ADDRESS"]
    if any(c.isspace() or c in "/@?#[]" for c in leader) or leader.count(":") == 1:
        raise SettingsError(
            f"SIE_LEADER_ADDRESS: {leader!r} is not a host name or address; give rank 0's "
            "host alone (e.g. sie-0.sie.default), without a scheme, port or path: the port is "
            "each model's rendezvous port"
        )
    return nodes, rank, leader


def _node_addresses(env: Mapping[str, str], nodes: int) -> tuple[str, ...]:
    """``SIE_NODE_ADDRESSES``: one address per rank of the group, rank 0 first, each a host
    (the worker's port assumed) or ``host:port`` (``[v6]:port``)."""
    raw = env.get("SIE_NODE_ADDRESSES", "").strip()
    if not raw:
        return ()
    if nodes < 2:
        raise SettingsError(
            "SIE_NODE_ADDRESSES: set, but this worker is no rank of a group (SIE_NODES is "
            "unset); unset it for one node"
        )
    entries = tuple(entry.strip() for entry in raw.split(","))
    if len(entries) != nodes or not all(entries):
        raise SettingsError(
            f"SIE_NODE_ADDRESSES: needs {nodes} addresses, one per rank of SIE_NODES={nodes}, "
            f"rank 0 first, comma-separated (host or host:port), got {raw!r}"
        )
    for entry in entries:
        if split_address(entry) is None:
            raise SettingsError(
                f"SIE_NODE_ADDRESSES: {entry!r} is not a host or host:port (an IPv6 address "
                "with a port in brackets: [fd00::1]:8080); no scheme or path"
            )
    return entries


def split_address(entry: str) -> tuple[str, int | None] | None:
    """``(host, port or None)`` of ``host``, ``host:port``, ``[v6]``, ``[v6]:port`` or a bare
    IPv6 address; None when it is none of them."""
    if any(c.isspace() or c in "/@?#" for c in entry) or not entry:
        return None
    host, port = entry, ""
    if entry.startswith("["):
        host, bracket, rest = entry[1:].partition("]")
        if not bracket or not host or (rest and not rest.startswith(":")):
            return None
        port = rest[1:] if rest else ""
        if rest and not port:
            return None
    elif entry.count(":") == 1:
        host, port = entry.split(":")
        if not port:
            return None
    if not host or "[" in host or "]" in host:
        return None
    if not port:
        return host, None
    if not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host, int(port)


def _engine_commands(env: Mapping[str, str]) -> dict[str, tuple[str, ...]]:
    """Every engine family's command prefix that is set (``SIE_SGLANG_COMMAND``, ...)."""
    found = {}
    for family in FAMILIES.values():
        variable = family.command_variable
        command = _command(env, variable) if variable else None
        if variable and command:
            found[variable] = command
    return found


def _command(env: Mapping[str, str], name: str) -> tuple[str, ...] | None:
    """A command prefix, split like a shell line (``numactl -N 0 python -m ...``)."""
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        return tuple(shlex.split(raw))
    except ValueError as exc:
        raise SettingsError(f"{name}: {exc} (split like a shell line)") from None


def _memory_budget(env: Mapping[str, str]) -> int | None:
    """``SIE_FAKE_MEMORY_BUDGET``: bytes, or a size with a unit (``80GiB``, ``24GB``), as SIE
    reads it."""
    raw = env.get("SIE_FAKE_MEMORY_BUDGET", "").strip()
    if not raw:
        return None
    try:
        return parse_memory(raw, bare_unit=1)
    except GpuError as exc:
        raise SettingsError(f"SIE_FAKE_MEMORY_BUDGET: {exc}") from None


def _threshold(env: Mapping[str, str]) -> float:
    name = "SIE_MEMORY_PRESSURE_THRESHOLD_PERCENT"
    raw = env.get(name, "").strip()
    if not raw:
        return 95.0
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 < value <= 100:
        raise SettingsError(f"{name}: must be a percentage above 0, at most 100, got {raw!r}")
    return value


def env_seconds(env: Mapping[str, str], name: str, default: float | None = None) -> float | None:
    """A finite number of seconds above zero from ``env[name]``, else ``default``."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name}: {raw!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise SettingsError(f"{name}: must be a finite number of seconds above zero, got {raw}")
    return value


def env_int(env: Mapping[str, str], name: str, default: int) -> int:
    """An integer above zero from ``env[name]``, else ``default``."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"{name}: {raw!r} is not an integer") from None
    if value <= 0:
        raise SettingsError(f"{name}: must be an integer above zero, got {raw}")
    return value
