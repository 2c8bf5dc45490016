"""Engine flags the worker reserves, refused in ``extra_launch_args`` exactly as the engine's
own parser would resolve them (:mod:`sie_worker.config.flags.option_tables`).

A token is refused when, in any shipped release's table of the engine, it resolves to a
reserved ``dest`` or is an ambiguous prefix with a reserved candidate. SGLang releases name
some dests differently (0.5.10.post1 stores ``--tp-size`` as ``tensor_parallel_size``, 0.5.23
as ``tp_size``); both are reserved. vLLM's are what places the engine (tensor, pipeline and
data parallelism, nodes, the rendezvous address, the executor, headless ranks, API servers),
where it listens, and ``--config`` (a file that could set any of them). Pipeline stages and
the multi-node flags are the worker's too (``pipeline_parallel_size``; groups of nodes).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from sie_worker.config.flags.option_tables import (
    OptionTable,
    flexible_option,
    option_tables,
    resolve,
)

__all__ = [
    "RESERVED_DESTS",
    "VLLM_RESERVED_DESTS",
    "fallback_table",
    "reserved_flag_problem",
    "reserved_flag_problems",
]

# dest -> (why the worker owns it, how to fix the config).
_SINGLE_ENGINE = (
    "SIE reserves GPUs from the declared width alone and runs one single-node engine per model"
)
_GROUP = (
    "the worker sets it from the declared widths and, on a group of nodes, from SIE_NODES, "
    "SIE_NODE_RANK and SIE_LEADER_ADDRESS"
)
_STAGES = (_GROUP, "remove it and set adapter_options.loadtime.pipeline_parallel_size")
_MASK = "the worker gives the engine its GPU block through CUDA_VISIBLE_DEVICES"
_LISTENER = (
    "SIE owns the engine's HTTP host and port (the worker server's own --host/--port are separate)"
)
_REASONS: Mapping[str, tuple[str, str]] = {
    "tp_size": (
        "the worker sets it from the declared width",
        "remove it and set adapter_options.loadtime.tensor_parallel_size",
    ),
    "dp_size": (_SINGLE_ENGINE, "remove it; run more worker replicas for more copies"),
    "ep_size": (_SINGLE_ENGINE, "remove it"),
    "pp_size": _STAGES,
    "nnodes": (_GROUP, "remove it"),
    "node_rank": (_GROUP, "remove it"),
    "dist_init_addr": (_GROUP, "remove it; adapter_options.loadtime.nccl_port sets the port"),
    "base_gpu_id": (_MASK, "remove it"),
    "gpu_id_step": (_MASK, "remove it"),
    "host": (_LISTENER, "remove it"),
    "port": (_LISTENER, "remove it"),
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
_REASONS = {**_REASONS, **{old: _REASONS[new] for old, new in _OLD_DESTS.items()}}
RESERVED_DESTS: frozenset[str] = frozenset(_REASONS)

_VLLM_SINGLE = "the worker reserves devices from the declared width and runs one engine per model"
_VLLM_DATA = (_VLLM_SINGLE, "remove it; run more worker replicas for more copies")
_VLLM_REASONS: Mapping[str, tuple[str, str]] = {
    "tensor_parallel_size": (
        "the worker sets it from the declared width",
        "remove it and set adapter_options.loadtime.tensor_parallel_size",
    ),
    "pipeline_parallel_size": _STAGES,
    "prefill_context_parallel_size": (_VLLM_SINGLE, "remove it"),
    "data_parallel_size": _VLLM_DATA,
    "data_parallel_size_local": _VLLM_DATA,
    "data_parallel_rank": _VLLM_DATA,
    "data_parallel_start_rank": _VLLM_DATA,
    "data_parallel_address": _VLLM_DATA,
    "data_parallel_rpc_port": _VLLM_DATA,
    "data_parallel_backend": _VLLM_DATA,
    "data_parallel_hybrid_lb": _VLLM_DATA,
    "data_parallel_external_lb": _VLLM_DATA,
    "data_parallel_multi_port_external_lb": _VLLM_DATA,
    "data_parallel_supervisor_port": _VLLM_DATA,
    "nnodes": (_GROUP, "remove it"),
    "node_rank": (_GROUP, "remove it"),
    "master_addr": (_GROUP, "remove it"),
    "master_port": (
        "the worker sets the rendezvous port",
        "remove it and set adapter_options.loadtime.nccl_port to choose one",
    ),
    "distributed_executor_backend": (
        "the worker starts the engine's ranks as its own process group (vLLM's mp executor)",
        "remove it",
    ),
    "headless": (_GROUP, "remove it"),
    "api_server_count": ("the worker relays requests to one API server per engine", "remove it"),
    "host": (_LISTENER, "remove it"),
    "port": (_LISTENER, "remove it"),
    "uds": (_LISTENER, "remove it"),
    "config": (
        "a config file may set the placement and listener flags behind the worker's back",
        "pass its other settings in extra_launch_args instead",
    ),
}
VLLM_RESERVED_DESTS: frozenset[str] = frozenset(_VLLM_REASONS)
_BY_ENGINE: Mapping[str, Mapping[str, tuple[str, str]]] = {
    "sglang": _REASONS,
    "vllm": _VLLM_REASONS,
}
_LABELS: Mapping[str, str] = {"sglang": "SGLang", "vllm": "vLLM"}

# The reserved option strings alone; used only when no generated table ships (should not
# happen: the package carries one per SGLang release a bundle runs).
_FALLBACK_OPTIONS: Mapping[str, str] = {
    "--tensor-parallel-size": "tp_size",
    "--tp-size": "tp_size",
    "--data-parallel-size": "dp_size",
    "--dp-size": "dp_size",
    "--expert-parallel-size": "ep_size",
    "--ep-size": "ep_size",
    "--ep": "ep_size",
    "--pipeline-parallel-size": "pp_size",
    "--pp-size": "pp_size",
    "--nnodes": "nnodes",
    "--node-rank": "node_rank",
    "--dist-init-addr": "dist_init_addr",
    "--nccl-init-addr": "dist_init_addr",
    "--base-gpu-id": "base_gpu_id",
    "--gpu-id-step": "gpu_id_step",
    "--host": "host",
    "--port": "port",
    "--nccl-port": "nccl_port",
}


def fallback_table() -> OptionTable:
    """The reserved flags alone: any prefix of one of them counts as that flag."""
    return OptionTable("fallback", dict(_FALLBACK_OPTIONS), complete=False)


def _describe(option_strings: Iterable[str]) -> str:
    return "/".join(option_strings)


def reserved_flag_problem(token: str, tables: Sequence[OptionTable] | None = None) -> str | None:
    """The refusal message for one ``extra_launch_args`` token, or None when it is allowed.
    ``tables``: the releases to check (default: SGLang's)."""
    for table in tables if tables is not None else (option_tables() or (fallback_table(),)):
        reasons = _BY_ENGINE[table.engine]
        match = resolve(token, table)
        reserved = [d for d in dict.fromkeys(match.dests) if d in reasons]
        if not reserved:
            continue
        label = _LABELS[table.engine]
        names = " or ".join(_describe(table.strings_of(d)) for d in reserved)
        why, fix = reasons[reserved[0]]
        if len(reserved) > 1:
            why, fix = "SIE sets placement and listener flags itself", "remove it"
        # As the parser reads it (vLLM: --tensor_parallel_size is --tensor-parallel-size);
        # a short option with its value attached (-n2) sets that option too.
        read = flexible_option(token) if table.flexible else token
        option = read.split("=", 1)[0]
        attached = not read.startswith("--") and match.candidates == (read[:2],)
        if option in table.options or attached:
            return f"{token!r} sets the reserved flag {names}: {why}; {fix}"
        if not table.complete:
            return f"{token!r} is a prefix of the reserved flag {names}: {why}; {fix}"
        if match.ambiguous:
            return (
                f"{token!r} is an ambiguous abbreviation that {label} may read as the reserved "
                f"flag {names}: {why}; spell out the option you mean"
            )
        return (
            f"{token!r} abbreviates the reserved flag {names} ({label} accepts any unambiguous "
            f"prefix): {why}; {fix}"
        )
    return None


def reserved_flag_problems(
    args: Sequence[str], tables: Sequence[OptionTable] | None = None
) -> list[tuple[int, str]]:
    """``(index, message)`` for every token of ``args`` that sets a reserved flag."""
    problems: list[tuple[int, str]] = []
    for index, token in enumerate(args):
        message = reserved_flag_problem(token, tables)
        if message is not None:
            problems.append((index, message))
    return problems
