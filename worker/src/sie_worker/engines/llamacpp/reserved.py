"""llama-server's flags the worker sets itself, every spelling its parser reads (short, long,
and their underscore forms, which the worker refuses too rather than let a start fail on
them), with why and how to fix the config. llama-server reads no abbreviations and no
``--flag=value`` form (it refuses that only when it starts: the worker refuses it at
validate, :mod:`~sie_worker.engines.llamacpp.checks`)."""

from __future__ import annotations

from collections.abc import Mapping

from sie_worker.engines.reserved_reasons import GROUP, LISTENER, MASK

__all__ = ["ENV_PREFIXES", "RESERVED", "reserved_spelling"]

_MODEL = (
    "the worker passes the model's GGUF file from its config (hf_id or model_path, and "
    "adapter_options.loadtime.gguf_file)",
    "remove it and set adapter_options.loadtime.gguf_file",
)
_SPLIT = (
    f"{MASK}, and splits the model over the block's devices itself",
    "remove it; set adapter_options.loadtime.split_mode (layer or row) or tensor_split",
)
_RPC = (GROUP, "remove it; a group of nodes (SIE_NODES) runs its followers as RPC servers")
_SLOTS = (
    "the server's slots are how many requests it runs at once, which the worker's admission "
    "and KV budget count on",
    "remove it",
)
_KEY = (
    "the worker guards its own API (SIE_API_KEY); a key on the engine would also close "
    "/metrics and /health to the worker",
    "remove it",
)
_METRICS = ("the worker turns the engine's metrics on and passes them through", "remove it")
_ALIAS = ("the worker names the model by its served id", "remove it")

# Option strings -> (why, fix), from llama-server --help of the pinned release.
_GROUPS: tuple[tuple[tuple[str, ...], tuple[str, str]], ...] = (
    (("-m", "--model", "-mu", "--model-url", "-hf", "-hfr", "--hf-repo", "-hff", "--hf-file",
      "-dr", "--docker-repo", "--models-dir", "--models-preset"), _MODEL),
    (("--host", "--port", "--reuse-port", "--path", "--ssl-key-file", "--ssl-cert-file"),
     (LISTENER, "remove it")),
    (("--rpc",), _RPC),
    (("-sm", "--split-mode", "-ts", "--tensor-split", "-mg", "--main-gpu", "-dev", "--device",
      "-ngl", "--gpu-layers", "--n-gpu-layers"), _SPLIT),
    (("-np", "--parallel"), _SLOTS),
    (("--api-key", "--api-key-file"), _KEY),
    (("--metrics",), _METRICS),
    (("-a", "--alias"), _ALIAS),
)  # fmt: skip
RESERVED: Mapping[str, tuple[str, str]] = {
    spelling: reason for spellings, reason in _GROUPS for spelling in spellings
}
# Every flag of llama-server also reads a variable (LLAMA_ARG_<NAME>, and LLAMA_API_KEY):
# refused in a profile's extra_env and cleared from the engine's environment, so nothing
# sets a flag behind the worker's back.
ENV_PREFIXES = ("LLAMA_ARG_", "LLAMA_API_KEY")


def reserved_spelling(token: str) -> str | None:
    """The reserved option ``token`` sets (its ``--flag=value`` form and the underscore
    forms of long options included), or None."""
    option = token.split("=", 1)[0]
    if option.startswith("--"):
        option = "--" + option[2:].replace("_", "-")
    return option if option in RESERVED else None
