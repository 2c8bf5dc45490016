"""Cold starts: how long a new replica takes to serve, by where its weights come from, and
how many requests pile up meanwhile. Pure arithmetic.

A cold start is container and process start, plus loading the weights from their source,
plus the engine's warm-up (CUDA graph capture, compilation):

    load s = weights bytes / source bytes per second
    cold start s = start s + load s + warm-up s

While a replica starts, the requests that arrive beyond what the ready replicas serve
wait: ``backlog = max(0, arrival rate - served rate) x cold start s``. The default sources
and times are assumptions to show the arithmetic (a 1 Gb/s hub download, a 1 GB/s network
volume, local NVMe at 3 GB/s, the host's page cache at 10 GB/s; 20 s start and 40 s warm-up):
measure your own. The table and backlog lines are printed exactly as seed 004's
``ColdStart`` program prints them (Java's ``%.1f``/``%.0f``, which round half up).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import Final

__all__ = [
    "DEFAULT_SOURCES",
    "DEFAULT_STARTUP_S",
    "DEFAULT_WARMUP_S",
    "TABLE_HEADER",
    "ColdStart",
    "WeightSource",
    "backlog",
    "backlog_line",
    "cold_starts",
    "parse_rate",
    "parse_source",
    "table_lines",
]

DEFAULT_STARTUP_S: Final = 20.0
DEFAULT_WARMUP_S: Final = 40.0
TABLE_HEADER: Final = "source                      model      load s  total cold start s"
_RATE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([kKMGT]?)([bB])(?:/s|ps)\s*$")
_SCALE = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


@dataclass(frozen=True)
class WeightSource:
    label: str
    bytes_per_second: float


DEFAULT_SOURCES: Final[tuple[WeightSource, ...]] = (
    WeightSource("Hub download, 1 Gb/s", 0.125e9),
    WeightSource("network volume, 1 GB/s", 1e9),
    WeightSource("local NVMe, 3 GB/s", 3e9),
    WeightSource("host page cache, 10 GB/s", 10e9),
)


@dataclass(frozen=True)
class ColdStart:
    source: WeightSource
    model: str
    weights_bytes: float
    load_s: float
    total_s: float


def cold_starts(
    models: Sequence[tuple[str, float]],
    sources: Sequence[WeightSource] = DEFAULT_SOURCES,
    *,
    startup_s: float = DEFAULT_STARTUP_S,
    warmup_s: float = DEFAULT_WARMUP_S,
) -> list[ColdStart]:
    """One row per model (``(name, weights bytes)``) and source, model by model."""
    rows = []
    for name, size in models:
        for source in sources:
            load = size / source.bytes_per_second
            rows.append(ColdStart(source, name, size, load, startup_s + load + warmup_s))
    return rows


def backlog(arrival_rate: float, served_rate: float, cold_start_s: float) -> float:
    """Requests that wait for the new replica: the arrivals the ready ones cannot serve."""
    return max(0.0, arrival_rate - served_rate) * cold_start_s


def _fixed(value: float, places: int) -> str:
    """``value`` with ``places`` decimals, rounded half up as Java's Formatter does."""
    quantum = Decimal(1).scaleb(-places)
    return str(Decimal(value).quantize(quantum, rounding=ROUND_HALF_UP))


def table_lines(rows: Sequence[ColdStart]) -> list[str]:
    """The header and one line per row, as ``%-26s  %-8s  %7.1f  %18.1f``; a longer model
    name widens its column for every row."""
    width = max([8, *(len(r.model) for r in rows)])
    header = TABLE_HEADER if width == 8 else TABLE_HEADER.replace("model   ", "model".ljust(width))
    lines = [header]
    for r in rows:
        lines.append(
            f"{r.source.label:<26}  {r.model:<{width}}  {_fixed(r.load_s, 1):>7}  "
            f"{_fixed(r.total_s, 1):>18}"
        )
    return lines


def backlog_line(cold_start_s: float, requests: float) -> str:
    """``cold start %3.0f s: %5.0f requests pile up before new capacity arrives``."""
    return (
        f"cold start {_fixed(cold_start_s, 0):>3} s: {_fixed(requests, 0):>5} requests pile up "
        "before new capacity arrives"
    )


def parse_rate(text: str) -> float:
    """Bytes per second from ``1Gb/s`` (bits), ``3GB/s``, ``500MB/s``, ``10Gbps``."""
    match = _RATE.match(text)
    if not match:
        raise ValueError(
            f"{text!r} is not a rate; write it like 1Gb/s (bits), 3GB/s or 500MB/s (bytes)"
        )
    number, scale, unit = match.groups()
    value = float(number) * _SCALE[scale] / (8 if unit == "b" else 1)
    if value <= 0:
        raise ValueError(f"{text!r}: a rate above zero")
    return value


def parse_source(text: str) -> WeightSource:
    """``LABEL=RATE``, e.g. ``NFS share=800MB/s``; a bare rate is its own label."""
    label, sep, rate = text.rpartition("=")
    if not sep:
        label, rate = text.strip(), text
    label = label.strip()
    if not label:
        raise ValueError(f"{text!r}: name the source before '=', e.g. 'NFS share=800MB/s'")
    return WeightSource(label, parse_rate(rate))
