"""The reasons the worker gives when it refuses an engine flag that it sets itself, shared by
the engine families' tables of reserved flags (``engines/*/reserved.py``): dest -> (why the
worker owns it, how to fix the config)."""

from __future__ import annotations

__all__ = ["GROUP", "LISTENER", "MASK", "SINGLE_ENGINE", "STAGES"]

SINGLE_ENGINE = (
    "SIE reserves GPUs from the declared width alone and runs one single-node engine per model"
)
GROUP = (
    "the worker sets it from the declared widths and, on a group of nodes, from SIE_NODES, "
    "SIE_NODE_RANK and SIE_LEADER_ADDRESS"
)
STAGES = (GROUP, "remove it and set adapter_options.loadtime.pipeline_parallel_size")
MASK = "the worker gives the engine its GPU block through CUDA_VISIBLE_DEVICES"
LISTENER = (
    "SIE owns the engine's HTTP host and port (the worker server's own --host/--port are separate)"
)
