"""The gateway's pools file (``SIE_GATEWAY_POOLS``): one entry per pool x bundle.

The chart renders it from ``workers.pools`` (the one source); local runs write it by hand::

    - pool: l4-4x                 # the pool's name (X-SIE-Pool)
      bundle: sglang              # the image bundle its pods run
      machine_profile: l4-4x      # what gpu="l4-4x" sends (X-SIE-MACHINE-PROFILE); default gpu_type
      gpu_type: l4                # matched when no pool's machine profile is the header
      slots: 1                    # serving slots per pod (SIE_GPU_COUNT)
      slot_width: 4               # GPUs per slot: the widest model a slot takes
      service: sie-l4-4x-sglang   # in a cluster: the Service whose EndpointSlices list its pods
      port: 8080                  #   and its port (the EndpointSlice's own port wins)
      # endpoints: [http://127.0.0.1:9001]   # instead of service: pod router URLs (local runs)
      resume: true                # resume a stream whose pod fails mid-stream (default true)

:func:`parse_pools` reports every problem at once, each naming the entry, the field and
the fix, sorted by where it is.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

__all__ = ["PoolKey", "PoolSpec", "PoolsFileError", "parse_pools", "read_pools_file"]

_FIELDS = (
    "pool",
    "bundle",
    "machine_profile",
    "gpu_type",
    "slots",
    "slot_width",
    "service",
    "port",
    "endpoints",
    "resume",
)
_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_MAX_BYTES = 1024 * 1024


class PoolsFileError(ValueError):
    """The pools file cannot be used; ``problems`` lists every line of the message."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(self.problems))


@dataclass(frozen=True, order=True)
class PoolKey:
    """One pool x bundle: what a Deployment, a Service and a pending-requests series are."""

    pool: str
    bundle: str

    def __str__(self) -> str:
        return f"{self.pool}/{self.bundle}"


@dataclass(frozen=True)
class PoolSpec:
    pool: str
    bundle: str
    machine_profile: str
    gpu_type: str
    slots: int = 1
    slot_width: int = 1
    service: str | None = None
    port: int | None = None
    endpoints: tuple[str, ...] | None = None  # local runs: pod router URLs instead of a Service
    # Streams whose pod fails mid-stream go on on another pod (DESIGN.md, "Resuming a stream").
    resume: bool = True

    @property
    def key(self) -> PoolKey:
        return PoolKey(self.pool, self.bundle)

    @property
    def gpu(self) -> str:
        """The pool's GPU name as cluster health shows it: machine profile, else GPU type."""
        return self.machine_profile or self.gpu_type

    def matches_profile(self, profile: str) -> bool:
        return profile.strip().lower() == self.machine_profile.lower()

    def matches_gpu_type(self, profile: str) -> bool:
        return profile.strip().lower() == self.gpu_type.lower()


def read_pools_file(path: Path) -> tuple[PoolSpec, ...]:
    """Read and check the pools file; raises :class:`PoolsFileError` naming every problem."""
    try:
        with path.open("rb") as handle:
            raw = handle.read(_MAX_BYTES + 1)
    except OSError as exc:
        raise PoolsFileError(
            [f"{path}: cannot read the pools file: {exc.strerror or exc}"]
        ) from exc
    if len(raw) > _MAX_BYTES:
        raise PoolsFileError([f"{path}: larger than 1 MiB; is this the pools file?"])
    try:
        data = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise PoolsFileError([f"{path}: $: is not valid YAML or JSON: {exc}"]) from None
    return parse_pools(data, source=str(path))


def parse_pools(data: object, *, source: str = "<pools>") -> tuple[PoolSpec, ...]:
    """Check parsed pools data; raises :class:`PoolsFileError` with one line per problem."""
    problems: list[tuple[str, str]] = []
    if not isinstance(data, list) or not data:
        got = "an empty list" if data == [] else type(data).__name__
        raise PoolsFileError(
            [
                f"{source}: $: must be a non-empty list of pools "
                f"({{pool, bundle, gpu_type, ...}} per pool x bundle), got {got}"
            ]
        )
    specs: list[PoolSpec] = []
    seen: dict[PoolKey, int] = {}
    for index, entry in enumerate(data):
        where = f"$[{index}]"
        if not isinstance(entry, Mapping):
            problems.append((where, f"must be a mapping, got {type(entry).__name__}"))
            continue
        spec, entry_problems = _entry(entry, where)
        problems += entry_problems
        if spec is None:
            continue
        if spec.key in seen:
            problems.append(
                (
                    f"{where}.bundle",
                    f"pool {spec.pool!r} with bundle {spec.bundle!r} is already entry "
                    f"$[{seen[spec.key]}]; list each pool x bundle once",
                )
            )
            continue
        seen[spec.key] = index
        specs.append(spec)
    if problems:
        raise PoolsFileError([f"{source}: {path}: {msg}" for path, msg in sorted(problems)])
    return tuple(specs)


def _entry(entry: Mapping[Any, Any], where: str) -> tuple[PoolSpec | None, list[tuple[str, str]]]:
    problems: list[tuple[str, str]] = []
    for key in entry:
        if key not in _FIELDS:
            close = difflib.get_close_matches(str(key), _FIELDS, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]}?" if close else "allowed keys: " + ", ".join(_FIELDS)
            problems.append((f"{where}.{key}", f"unknown key; {hint}"))

    def name(field: str, *, required: bool) -> str | None:
        value = entry.get(field)
        if value is None:
            if required:
                problems.append((f"{where}.{field}", f"is required; add {field}"))
            return None
        if not isinstance(value, str) or not _NAME.match(value):
            problems.append(
                (
                    f"{where}.{field}",
                    f"must be a name of letters, digits, '-', '_' and '.', got {value!r}",
                )
            )
            return None
        return value

    def count(field: str, low: int, high: int, default: int | None) -> int | None:
        value = entry.get(field, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            problems.append(
                (f"{where}.{field}", f"must be an integer from {low} to {high}, got {value!r}")
            )
            return None
        return value

    pool = name("pool", required=True)
    bundle = name("bundle", required=True)
    gpu_type = name("gpu_type", required=True)
    profile = name("machine_profile", required=False)
    slots = count("slots", 1, 64, 1)
    width = count("slot_width", 1, 64, 1)
    service = name("service", required=False)
    port = count("port", 1, 65535, None)
    endpoints = _endpoints(entry, where, problems)
    resume = entry.get("resume", True)
    if not isinstance(resume, bool):
        problems.append((f"{where}.resume", f"must be true or false, got {resume!r}"))
    if service is None and endpoints is None and "service" not in entry:
        problems.append(
            (
                f"{where}.service",
                "is required (the pool x bundle Service) unless endpoints lists the pod "
                "router URLs of a local run; add one of them",
            )
        )
    if service is not None and "endpoints" in entry:
        problems.append(
            (
                f"{where}.endpoints",
                "cannot be given with service: pods come from the Service's EndpointSlices "
                "in a cluster, or from endpoints in a local run; keep one",
            )
        )
    if service is not None and "port" not in entry:
        problems.append((f"{where}.port", "is required with service; add the Service port"))
    if problems or pool is None or bundle is None or gpu_type is None:
        return None, problems
    assert slots is not None
    assert width is not None
    return (
        PoolSpec(
            pool=pool,
            bundle=bundle,
            machine_profile=profile or gpu_type,
            gpu_type=gpu_type,
            slots=slots,
            slot_width=width,
            service=service,
            port=port,
            endpoints=endpoints,
            resume=resume is not False,
        ),
        problems,
    )


def _endpoints(
    entry: Mapping[Any, Any], where: str, problems: list[tuple[str, str]]
) -> tuple[str, ...] | None:
    if "endpoints" not in entry:
        return None
    value = entry["endpoints"]
    if value is None:
        return ()
    if not isinstance(value, list):
        problems.append((f"{where}.endpoints", f"must be a list of URLs, got {value!r}"))
        return None
    urls: list[str] = []
    for i, item in enumerate(value):
        parts = urlsplit(item) if isinstance(item, str) else None
        if (
            parts is None
            or parts.scheme != "http"
            or not parts.hostname
            or parts.path not in ("", "/")
            or parts.query
        ):
            problems.append(
                (
                    f"{where}.endpoints[{i}]",
                    f"must be a pod router URL like http://127.0.0.1:8080, got {item!r}",
                )
            )
            continue
        urls.append(f"http://{parts.netloc}")
    if len(set(urls)) != len(urls):
        problems.append((f"{where}.endpoints", "lists a URL twice; list each pod once"))
    return tuple(urls)
