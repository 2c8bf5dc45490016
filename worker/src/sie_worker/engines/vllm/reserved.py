"""vLLM's flags the worker sets itself: dest -> (why, fix): what places the engine (tensor,
pipeline and data parallelism, nodes, the rendezvous address, the executor, headless ranks,
API servers), where it listens, and ``--config`` (a file that could set any of them)."""

from __future__ import annotations

from collections.abc import Mapping

from sie_worker.engines.reserved_reasons import GROUP, LISTENER, STAGES

__all__ = ["REASONS", "RESERVED_DESTS"]

_SINGLE = "the worker reserves devices from the declared width and runs one engine per model"
_DATA = (_SINGLE, "remove it; run more worker replicas for more copies")
REASONS: Mapping[str, tuple[str, str]] = {
    "tensor_parallel_size": (
        "the worker sets it from the declared width",
        "remove it and set adapter_options.loadtime.tensor_parallel_size",
    ),
    "pipeline_parallel_size": STAGES,
    "prefill_context_parallel_size": (_SINGLE, "remove it"),
    "data_parallel_size": _DATA,
    "data_parallel_size_local": _DATA,
    "data_parallel_rank": _DATA,
    "data_parallel_start_rank": _DATA,
    "data_parallel_address": _DATA,
    "data_parallel_rpc_port": _DATA,
    "data_parallel_backend": _DATA,
    "data_parallel_hybrid_lb": _DATA,
    "data_parallel_external_lb": _DATA,
    "data_parallel_multi_port_external_lb": _DATA,
    "data_parallel_supervisor_port": _DATA,
    "nnodes": (GROUP, "remove it"),
    "node_rank": (GROUP, "remove it"),
    "master_addr": (GROUP, "remove it"),
    "master_port": (
        "the worker sets the rendezvous port",
        "remove it and set adapter_options.loadtime.nccl_port to choose one",
    ),
    "distributed_executor_backend": (
        "the worker starts the engine's ranks as its own process group (vLLM's mp executor)",
        "remove it",
    ),
    "headless": (GROUP, "remove it"),
    "api_server_count": ("the worker relays requests to one API server per engine", "remove it"),
    "host": (LISTENER, "remove it"),
    "port": (LISTENER, "remove it"),
    "uds": (LISTENER, "remove it"),
    "config": (
        "a config file may set the placement and listener flags behind the worker's back",
        "pass its other settings in extra_launch_args instead",
    ),
}
RESERVED_DESTS: frozenset[str] = frozenset(REASONS)
