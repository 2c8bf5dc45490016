"""The llama.cpp adapter's load-time options: one table, option -> llama-server flag -> rule.

Rows are :class:`~sie_worker.config.flags.option_rules.EngineOption`, as for SGLang and vLLM
(help text from llama-server's own ``--help``, llama.cpp @0c1e57098). Options of the other
engines' adapters that llama-server has no flag for (``compute_precision``: a GGUF's types are
its own; ``gpu_memory_utilization``, ``trust_remote_code``, ``quantization``, LoRA, pipeline
stages...) are not here, so a load refuses them with the closest accepted spelling.

How the model is spread (DESIGN.md, "Engines"): width 1 is ``-sm none``; width N on cuda
devices is the block visible, ``-sm layer`` (or ``split_mode: row``), one ``-ts`` proportion
per device (equal, or ``tensor_split``) and every layer offloaded (``-ngl all``); on cpu
devices the width is 1 (:func:`split_args`, :func:`split_problem`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any

from sie_worker.config.files.values import described
from sie_worker.config.flags.option_rules import (
    EngineOption,
    Release,
    boolean,
    choice_of,
    engine_option_problem,
    integer,
    revision,
    rule_of,
    sampling,
    seconds,
    stops,
    text,
    width,
)
from sie_worker.config.widths import MAX_WIDTH

__all__ = [
    "LLAMACPP_OPTIONS",
    "SPLIT_MODES",
    "gguf_file",
    "option_problem",
    "split_args",
    "split_mode",
    "split_problem",
    "tensor_split",
]

# What split_mode accepts: llama-server's "none" is width 1 itself, and its "tensor" is
# marked EXPERIMENTAL in this release.
SPLIT_MODES: tuple[str, ...] = ("layer", "row")
# One adapter family so far: generation (OpenAI chat and completions, SIE generate).
_ALL = frozenset({"generation"})
# llama.cpp's split files: <name>-00001-of-00003.gguf; llama-server takes the first and
# reads the others beside it.
_SPLIT_PART = re.compile(r"-(?P<part>\d{5})-of-(?P<parts>\d{5})\.gguf$", re.IGNORECASE)


@rule_of("a path of a .gguf file inside the model's repository or folder")
def gguf_file(value: Any, release: Release) -> str | None:
    expected = "must be the path of a .gguf file inside the model's repository or folder"
    if not isinstance(value, str) or not value.strip():
        return f"{expected}, got {described(value)}"
    path = PurePosixPath(value)
    if path.is_absolute() or ".." in path.parts or "\\" in value:
        return f"{expected} (relative, without ..), got {value!r}"
    if path.suffix.lower() != ".gguf":
        return f"{expected} (its name ends in .gguf), got {value!r}"
    split = _SPLIT_PART.search(path.name)
    if split is not None and int(split.group("part")) != 1:
        part = int(split.group("part"))
        first = _SPLIT_PART.sub(f"-00001-of-{split.group('parts')}.gguf", path.name)
        return f"names part {part} of a split model: name its first part, {first}"
    return None


@rule_of("a list of proportions >= 0, one per device of the model's block")
def tensor_split(value: Any, release: Release) -> str | None:
    expected = (
        f"must be a list of 1 to {MAX_WIDTH} proportions (numbers >= 0, not all 0), one per "
        "device of the model's block, e.g. [3, 1]"
    )
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_WIDTH:
        return f"{expected}, got {described(value)}"
    for item in value:
        if (
            isinstance(item, bool)
            or not isinstance(item, int | float)
            or not math.isfinite(float(item))
            or item < 0
        ):
            return f"{expected}, got {described(item)} in it"
    if not any(item > 0 for item in value):
        return f"{expected}, got only zeros"
    return None


@rule_of("layer or row")
def split_mode(value: Any, release: Release) -> str | None:
    if value in SPLIT_MODES:
        return None
    why = {
        "none": " (width 1 runs -sm none by itself)",
        "tensor": " (llama.cpp marks -sm tensor experimental)",
    }.get(value if isinstance(value, str) else "", "")
    return f"must be layer or row{why}, got {described(value)}"


_o = EngineOption  # a row of the table, short for the rows below


_TABLE: tuple[EngineOption, ...] = (
    _o("tensor_parallel_size", _ALL, "worker", "--tensor-split", width, "1",
       "devices the model is split across: on cuda devices the worker's block, one -ts "
       "proportion each; on cpu devices 1"),
    _o("gguf_file", _ALL, "worker", "--model", gguf_file,
       "the only .gguf file of the repository or folder",
       "the GGUF file llama-server loads (-m), a path inside the model's repository or "
       "folder; a split model names its first part (-00001-of-0000N.gguf). The weights "
       "fetch takes that file (every part of a split one) and nothing else"),
    _o("tensor_split", _ALL, "worker", "--tensor-split", tensor_split, "equal proportions",
       "fraction of the model to offload to each GPU, comma-separated list of proportions, "
       "e.g. 3,1 (one per device of the block, in block order; only above width 1)"),
    _o("split_mode", _ALL, "worker", "--split-mode", split_mode, "layer above width 1",
       "how to split the model across multiple GPUs: layer (split layers and KV across "
       "GPUs, pipelined) or row (split weight across GPUs by rows, parallelized); only "
       "above width 1"),
    _o("request_read_timeout_s", _ALL, "worker", None, seconds,
       "SIE_SGLANG_GENERATE_READ_TIMEOUT_S, else none",
       "seconds the worker waits for the engine's next bytes before failing the request"),
    _o("startup_timeout_s", _ALL, "worker", None, seconds, "SIE_MODEL_READY_TIMEOUT_S, else 900",
       "seconds the worker waits for the engine to be ready"),
    _o("max_seq_length", _ALL, "flag", "--ctx-size", integer(1, 2**31 - 1),
       "max_sequence_length, else tasks.generate.context_length, else the GGUF's",
       "size of the prompt context (prompt and output)"),
    _o("revision", _ALL, "worker", None, revision, "hf_revision",
       "the repository revision the GGUF file is fetched from (overrides hf_revision)"),
    _o("served_model_name", _ALL, "worker", "--alias", text, "the served id",
       "SIE's name for the engine, which clients never see; the worker names the engine "
       "after the served id (-a) so answers carry the id the client asked for"),
    _o("default_sampling", _ALL, "worker", None, sampling, "none",
       "request sampling defaults, as runtime.default_sampling (which wins)"),
    _o("stop_tokens", _ALL, "worker", None, stops, "none",
       "stop strings added to requests, as runtime.stop_tokens (which wins)"),
    _o("flash_attention", _ALL, "flag", "--flash-attn", choice_of("--flash-attn"),
       "llama.cpp's (auto)", "set Flash Attention use ('on', 'off', or 'auto')"),
    _o("enable_prefix_caching", _ALL, "flag", "--cache-prompt", boolean, "llama.cpp's (on)",
       "whether to enable prompt caching (false: --no-cache-prompt)"),
    _o("nccl_port", _ALL, "worker", None, integer(1024, 65535), "30400 + the model's index",
       "the port of the RPC servers of a group of nodes (ggml-rpc-server -p on ranks >= 1, "
       "--rpc on the leader); only in a group"),
)  # fmt: skip
LLAMACPP_OPTIONS: Mapping[str, EngineOption] = {option.name: option for option in _TABLE}


def option_problem(name: str, value: Any, release: Release) -> str | None:
    """Why this option's value breaks its rule (or needs a flag the release lacks), or None."""
    return engine_option_problem(LLAMACPP_OPTIONS[name], value, release)


def split_problem(loadtime: Mapping[str, Any], model_width: int, device_kind: str) -> str | None:
    """Why the split options do not fit a model of ``model_width`` on ``device_kind``
    devices (``cuda`` or ``cpu``), or None. Each option's own rule has passed already."""
    if device_kind == "cpu" and model_width != 1:
        return (
            f"llama.cpp runs on cpu devices at width 1 only (its threads are the device's "
            f"cores), got tensor_parallel_size {model_width}"
        )
    proportions = loadtime.get("tensor_split")
    if proportions is not None and len(proportions) != model_width:
        return (
            f"tensor_split has {len(proportions)} proportions for a model of width "
            f"{model_width}: give one per device of its block"
        )
    return None


def split_args(
    model_width: int,
    tensor_split: Sequence[float] | None = None,
    split_mode: str | None = None,
    *,
    device_kind: str = "cuda",
) -> tuple[str, ...]:
    """llama-server's placement flags for a block of ``model_width`` devices of
    ``device_kind``: ``-sm none`` on one device; ``-sm layer|row -ts p0,p1,...`` (equal
    proportions unless ``tensor_split``) on several; every layer offloaded on cuda, none on
    cpu."""
    layers = ("-ngl", "all") if device_kind == "cuda" else ("-ngl", "0")
    if model_width == 1:
        return ("-sm", "none", *layers)
    proportions = tensor_split if tensor_split is not None else [1] * model_width
    return (
        "-sm",
        split_mode or "layer",
        "-ts",
        ",".join(_proportion(p) for p in proportions),
        *layers,
    )


def _proportion(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))
