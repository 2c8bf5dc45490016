"""Pick the torch device and dtype for ``--device`` / ``--dtype``.

The worker hands an engine its GPU through ``CUDA_VISIBLE_DEVICES`` (empty for a CPU
slot), so ``auto`` means: CUDA when torch sees exactly the one device of the mask, else CPU.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Placement",
    "StartupError",
    "cap_cuda_memory",
    "choose_placement",
    "resolve_placement",
    "torch_dtype",
]

_log = logging.getLogger("sie_worker.engines")


class StartupError(RuntimeError):
    """The engine cannot start as asked; the message names the option and the fix."""


@dataclass(frozen=True)
class Placement:
    device: str  # "cpu" or "cuda:0"
    dtype: str  # "float32" | "bfloat16" | "float16" | "auto" (the checkpoint's own)


def choose_placement(requested_device: str, requested_dtype: str, cuda_count: int) -> Placement:
    """Pure decision from what torch sees; see the module docstring."""
    mask = os.environ.get("CUDA_VISIBLE_DEVICES")
    if requested_device == "cpu":
        device = "cpu"
    elif requested_device == "cuda":
        if cuda_count == 0:
            raise StartupError(
                f"--device cuda: torch sees no CUDA device (CUDA_VISIBLE_DEVICES={mask!r}); "
                "give the engine a GPU or use --device cpu"
            )
        if cuda_count > 1:
            _log.warning("torch sees %d CUDA devices; this engine uses cuda:0 only", cuda_count)
        device = "cuda:0"
    elif cuda_count == 1:
        device = "cuda:0"
    else:
        if cuda_count > 1:
            _log.warning(
                "--device auto: torch sees %d CUDA devices (CUDA_VISIBLE_DEVICES=%r), not one; "
                "serving on CPU. Set the mask to one device or pass --device cuda",
                cuda_count,
                mask,
            )
        device = "cpu"
    # why: reduced precision on CPU is slow and lossy; "auto" there means float32
    dtype = "float32" if requested_dtype == "auto" and device == "cpu" else requested_dtype
    return Placement(device=device, dtype=dtype)


def resolve_placement(requested_device: str, requested_dtype: str) -> Placement:
    import torch

    count = torch.cuda.device_count() if requested_device != "cpu" else 0
    return choose_placement(requested_device, requested_dtype, count)


def cap_cuda_memory(placement: Placement, fraction: float | None) -> None:
    """Hold torch's CUDA allocator to ``fraction`` of the device (what the worker reserved
    for this engine beside other models); nothing on CPU or without a fraction."""
    if fraction is None or not placement.device.startswith("cuda"):
        return
    import torch

    torch.cuda.set_per_process_memory_fraction(fraction, torch.device(placement.device))
    _log.info("CUDA allocator capped at %.3f of %s", fraction, placement.device)


def torch_dtype(name: str) -> Any:
    """The ``dtype`` argument for ``from_pretrained``: a torch dtype, or "auto"."""
    import torch

    return "auto" if name == "auto" else getattr(torch, name)
