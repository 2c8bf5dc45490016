"""``sie-worker size``'s section on models sharing GPUs (:mod:`sie_worker.sizing.packing`), as
a table and as JSON."""

from __future__ import annotations

import textwrap
from typing import Any

from sie_worker.engines.registry import family_of
from sie_worker.sizing.packing import Packing, Seat

__all__ = ["sharing_json", "sharing_table", "warnings_of"]


_WIDTH = 80


def _gb(n: float) -> str:
    return f"{n / 1e9:,.1f} GB"


def _option(engine: str) -> str:
    """The load-time option that declares the engine's share (SGLang's name where it has
    none: the column of the JSON)."""
    return family_of(engine).memory_option or "mem_fraction_static"


def _flag(engine: str) -> str:
    """The flag the engine's share is passed as."""
    return family_of(engine).memory_flag or "(none)"


def _seat_json(seat: Seat) -> dict[str, Any]:
    option = _option(seat.engine)
    return {
        "model": seat.name,
        "engine": seat.engine,
        option: seat.fraction,
        f"{option}_suggested": seat.suggested,
        "reserved_bytes": seat.reserved_bytes,
        "engine_share": seat.share,
    }


def sharing_json(packing: Packing) -> dict[str, Any]:
    return {
        "gpu_memory_bytes": packing.gpu_memory_bytes,
        "budget_bytes": packing.budget_bytes,
        "gpus": [[_seat_json(s) for s in gpu] for gpu in packing.gpus],
        "groups": [{"model": m, "width": w} for m, w in packing.groups],
        "no_width": list(packing.unplaceable),
        "gpus_shared": packing.gpus_shared,
        "gpus_exclusive": packing.gpus_exclusive,
        "warnings": warnings_of(packing),
    }


def warnings_of(packing: Packing) -> list[str]:
    return [
        f"{seat.name}: {_option(seat.engine)} {seat.fraction:g} reserves "
        f"{_gb(seat.fraction * packing.gpu_memory_bytes)}, {_gb(seat.short_bytes)} less than "
        "its weights and KV cache need: raise it, or shorten the context or the sequences"
        for gpu in packing.gpus
        for seat in gpu
        if seat.short_bytes > 0 and seat.fraction is not None
    ]


def _share_text(seat: Seat) -> str:
    if seat.share is None:
        return "does not fit beside the models before it"
    return f"starts with {_flag(seat.engine)} {seat.share:.3f}"


def sharing_table(packing: Packing) -> str:
    """The GPUs, the models on each in load order, their reservations and shares."""
    percent = packing.budget_bytes / packing.gpu_memory_bytes * 100
    lines = [
        f"Sharing GPUs of {_gb(packing.gpu_memory_bytes)} (budget {_gb(packing.budget_bytes)} "
        f"at {percent:.0f}%): {packing.gpus_shared} GPU(s), where one GPU per model needs "
        f"{packing.gpus_exclusive}",
    ]
    width = max((len(s.name) for gpu in packing.gpus for s in gpu), default=0)
    for number, gpu in enumerate(packing.gpus, 1):
        label = f"GPU {number}"
        for seat in gpu:
            if seat.fraction is not None:
                declared = f"{_option(seat.engine)} {seat.fraction:.2f}"
                declared += " (suggested)" if seat.suggested else " (declared)"
            else:
                declared = family_of(seat.engine).label
            lines.append(
                f"{label:<7}{seat.name:<{width}}  {declared}; reserves "
                f"{_gb(seat.reserved_bytes)}; {_share_text(seat)}"
            )
            label = ""
    for model, group_width in packing.groups:
        lines.append(f"{model}: width {group_width}, claims {group_width} GPUs whole")
    for model in packing.unplaceable:
        lines.append(f"{model}: no width from 1 to 8 holds it (see its plan above)")
    lines += [f"warning: {w}" for w in warnings_of(packing)]
    wrapped: list[str] = []
    for line in lines:
        # Seat lines continue under the model's name, warnings under their text.
        indent = 7 if line.startswith(("GPU", " ")) else 9 if line.startswith("warning") else 2
        wrapped += textwrap.wrap(
            line, _WIDTH, subsequent_indent=" " * indent, break_on_hyphens=False
        )
    return "\n".join(wrapped)
