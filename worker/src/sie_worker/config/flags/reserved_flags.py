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
from sie_worker.engines.registry import family_of
from sie_worker.engines.sglang.reserved import RESERVED_DESTS as SGLANG_RESERVED
from sie_worker.engines.vllm.reserved import RESERVED_DESTS as VLLM_RESERVED

__all__ = [
    "RESERVED_DESTS",
    "VLLM_RESERVED_DESTS",
    "fallback_table",
    "reserved_flag_problem",
    "reserved_flag_problems",
]

# The families' tables of reserved dests, for the tests that compare them with the parsers.
RESERVED_DESTS: frozenset[str] = SGLANG_RESERVED
VLLM_RESERVED_DESTS: frozenset[str] = VLLM_RESERVED

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
        family = family_of(table.engine)
        reasons = family.reserved
        match = resolve(token, table)
        reserved = [d for d in dict.fromkeys(match.dests) if d in reasons]
        if not reserved:
            continue
        label = family.label
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
