"""llama.cpp's command lines for one load. Pure.

``llama-server`` (``SIE_LLAMACPP_COMMAND``, default ``llama-server`` on PATH), in order:

- ``-m <file>``: ``gguf_file`` in the model's folder (``weights_path``/``model_path``, or
  the fetched snapshot); ``--alias`` the served id; ``--host 127.0.0.1 --port N``;
  ``--metrics`` (the worker passes ``/metrics`` through);
- the split (:func:`~sie_worker.engines.llamacpp.options.split_args`): on cuda devices (the
  block visible) every layer offloaded, ``-sm none`` at width 1, above it ``-sm layer`` (or
  ``split_mode: row``) with one ``-ts`` proportion per device (equal, or ``tensor_split``);
  on cpu devices no offload and ``-t`` the block's cores (llama.cpp counts the machine's
  cores otherwise, not the process's affinity);
- a group's leader: ``--rpc`` every follower's ``host:port`` and every layer offloaded, so
  llama.cpp spreads the layers over its own device and the followers' RPC devices;
- ``-c`` the context length, ``--flash-attn``, ``--cache-prompt``/``--no-cache-prompt`` as
  declared, then ``extra_launch_args``.

A follower of a group (rank >= 1) runs ``ggml-rpc-server -H <its own address> -p <the group's
port>``, found beside ``llama-server`` (same folder, or the same wrapper); ``-t`` its cores
on cpu devices. Its address is its pod's (``SIE_NODE_ADDRESSES``, or the LeaderWorkerSet
name), never 0.0.0.0: the RPC server has no authentication (upstream's warning).
"""

from __future__ import annotations

from pathlib import Path

from sie_worker.engines.llamacpp.options import split_args
from sie_worker.worker.group_peers import rank_hosts
from sie_worker.worker.launcher.argv_inputs import ENGINE_HOST, ArgvInputs

__all__ = ["RPC_PROGRAM", "SERVER_PROGRAM", "gguf_path", "llamacpp_argv", "rpc_argv"]

SERVER_PROGRAM = "llama-server"
RPC_PROGRAM = "ggml-rpc-server"


def gguf_path(folder: str, gguf_file: object) -> str:
    """The model file: ``gguf_file`` in ``folder`` (checked at load), else the folder's one
    ``.gguf`` file (the load refuses a folder with none or several)."""
    if isinstance(gguf_file, str) and gguf_file:
        return str(Path(folder) / gguf_file)
    found = sorted(Path(folder).glob("*.gguf"))
    return str(found[0]) if found else str(Path(folder) / "model.gguf")


def llamacpp_argv(inputs: ArgvInputs, command: list[str]) -> tuple[str, ...]:
    """The leader's (or a lone node's) ``llama-server`` command line."""
    served, options = inputs.served, inputs.options
    profile = served.profile
    loadtime = profile.loadtime
    folder = options.model_path or served.config.hf_id
    argv = [*command, "-m", gguf_path(folder, loadtime.get("gguf_file"))]
    argv += ["--alias", served.id, "--host", ENGINE_HOST, "--port", str(inputs.port), "--metrics"]
    split = loadtime.get("tensor_split")
    placement = list(
        split_args(
            options.claim_width,
            split if isinstance(split, list) else None,
            str(loadtime["split_mode"]) if loadtime.get("split_mode") else None,
            device_kind="cpu" if inputs.on_cpu else "cuda",
        )
    )
    if inputs.group is not None:
        hosts = rank_hosts(inputs.settings) or ()
        followers = [f"{_host(h)}:{inputs.group.port}" for h in hosts[1:]]
        # Every layer offloaded: llama.cpp spreads them over its device and the followers'.
        placement[placement.index("-ngl") + 1] = "all"
        placement += ["--rpc", ",".join(followers)]
    argv += placement
    if inputs.on_cpu and inputs.cores:
        argv += ["-t", str(sum(len(c) for c in inputs.cores))]
    if options.context_length is not None:
        argv += ["-c", str(options.context_length)]
    if isinstance(loadtime.get("flash_attention"), str):
        argv += ["--flash-attn", loadtime["flash_attention"]]
    if isinstance(loadtime.get("enable_prefix_caching"), bool):
        argv.append("--cache-prompt" if loadtime["enable_prefix_caching"] else "--no-cache-prompt")
    argv += profile.extra_launch_args
    return tuple(argv)


def rpc_argv(inputs: ArgvInputs, command: list[str]) -> tuple[str, ...]:
    """A follower's ``ggml-rpc-server`` command line (rank >= 1 of a group of nodes)."""
    group = inputs.group
    assert group is not None
    hosts = rank_hosts(inputs.settings)
    if not hosts or len(hosts) <= group.rank:
        raise ValueError(
            f"{inputs.served.id}: rank {group.rank}'s own address is unknown; set "
            "SIE_NODE_ADDRESSES (the RPC server binds its pod's address, never 0.0.0.0)"
        )
    argv = [*_beside(command, SERVER_PROGRAM, RPC_PROGRAM), "-H", hosts[group.rank]]
    argv += ["-p", str(group.port)]
    if inputs.on_cpu and inputs.cores:
        argv += ["-t", str(sum(len(c) for c in inputs.cores))]
    return tuple(argv)


def _beside(command: list[str], program: str, other: str) -> list[str]:
    """``command`` with its ``program`` token swapped for ``other`` in the same folder (a
    wrapper's arguments kept); ``other`` alone when no token names ``program``."""
    for index, token in enumerate(command):
        path = Path(token)
        if path.name == program:
            return [*command[:index], str(path.with_name(other)), *command[index + 1 :]]
    return [other]


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
