"""SGLang's flags the worker sets itself: dest -> (why, fix), in every release's name of
the dest (0.5.10.post1 stores ``--tp-size`` as ``tensor_parallel_size``, 0.5.23 as
``tp_size``); refused in ``extra_launch_args`` (:mod:`sie_worker.config.flags.reserved_flags`)."""

from __future__ import annotations

from collections.abc import Mapping

from sie_worker.engines.reserved_reasons import GROUP, LISTENER, MASK, SINGLE_ENGINE, STAGES

__all__ = ["REASONS", "RESERVED_DESTS"]

REASONS: Mapping[str, tuple[str, str]] = {
    "tp_size": (
        "the worker sets it from the declared width",
        "remove it and set adapter_options.loadtime.tensor_parallel_size",
    ),
    "dp_size": (SINGLE_ENGINE, "remove it; run more worker replicas for more copies"),
    "ep_size": (SINGLE_ENGINE, "remove it"),
    "pp_size": STAGES,
    "nnodes": (GROUP, "remove it"),
    "node_rank": (GROUP, "remove it"),
    "dist_init_addr": (GROUP, "remove it; adapter_options.loadtime.nccl_port sets the port"),
    "base_gpu_id": (MASK, "remove it"),
    "gpu_id_step": (MASK, "remove it"),
    "host": (LISTENER, "remove it"),
    "port": (LISTENER, "remove it"),
    "nccl_port": (
        "the worker sets the rendezvous port",
        "remove it and set adapter_options.loadtime.nccl_port to choose one",
    ),
}
# Older releases' names for the same dests (SGLang 0.5.10.post1 and before).
_OLD_DESTS: Mapping[str, str] = {
    "tensor_parallel_size": "tp_size",
    "data_parallel_size": "dp_size",
    "expert_parallel_size": "ep_size",
    "pipeline_parallel_size": "pp_size",
}
REASONS = {**REASONS, **{old: REASONS[new] for old, new in _OLD_DESTS.items()}}
RESERVED_DESTS: frozenset[str] = frozenset(REASONS)
