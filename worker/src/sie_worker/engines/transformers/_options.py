"""The default engine's command line (the contract in docs/architecture.md). Pure."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, cast

from sie_worker.sie_api.texts import check_template

__all__ = ["DTYPES", "EngineOptions", "Task", "build_parser", "parse_options"]

Task = Literal["encode", "generate", "score"]

# Canonical names first; the rest are the spellings SGLang and torch users reach for.
DTYPES: dict[str, str] = {
    "auto": "auto",
    "float32": "float32",
    "bfloat16": "bfloat16",
    "float16": "float16",
    "float": "float32",
    "fp32": "float32",
    "bf16": "bfloat16",
    "half": "float16",
    "fp16": "float16",
}


@dataclass(frozen=True)
class EngineOptions:
    model_path: str
    host: str
    port: int
    task: Task
    served_model_name: str
    dtype: str  # canonical: auto | float32 | bfloat16 | float16
    device: str  # auto | cpu | cuda
    threads: int | None
    max_batch_size: int
    revision: str | None
    context_length: int | None
    # encode: how input text is shaped (SIE's options; a request may override them)
    query_template: str | None = None
    doc_template: str | None = None
    default_instruction: str | None = None
    normalize: bool = True
    # generate: LoRA adapters (name, folder), chosen per request; peft applies them
    loras: tuple[tuple[str, str], ...] = ()
    max_loras_per_batch: int | None = None
    # On CUDA: the share of the device this engine's allocator may take (the worker's
    # placement reserved that much for it); None: no cap.
    cuda_memory_fraction: float | None = None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sie_worker.engines.transformers",
        description=(
            "Serve one transformers / sentence-transformers model over an OpenAI-style HTTP "
            "API on CPU or on the single CUDA device of CUDA_VISIBLE_DEVICES."
        ),
        # why: the worker owns this argv; a prefix must never silently match another flag
        allow_abbrev=False,
    )
    add = parser.add_argument
    add("--model-path", required=True, help="local model directory, or a Hugging Face id")
    add("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    add("--port", type=_port, required=True, help="listen port")
    add(
        "--task",
        choices=("encode", "generate", "score"),
        required=True,
        help=(
            "encode: /v1/embeddings; generate: /v1/completions and /v1/chat/completions; "
            "score: /v1/rerank (a cross-encoder: AutoModelForSequenceClassification)"
        ),
    )
    add("--served-model-name", default=None, help="model id in responses (default: --model-path)")
    add(
        "--dtype",
        type=_dtype,
        default="auto",
        help="auto (float32 on CPU, the checkpoint's dtype on CUDA), float32, bfloat16, float16",
    )
    add(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="auto: cuda when torch sees exactly one device in the mask, else cpu",
    )
    add(
        "--threads",
        type=_positive("--threads"),
        default=None,
        help="torch CPU threads (default: torch's own choice)",
    )
    add(
        "--max-batch-size",
        type=_positive("--max-batch-size"),
        default=32,
        help="inputs per forward pass for embeddings (default 32)",
    )
    add("--revision", default=None, help="model revision, for a Hugging Face id")
    add(
        "--context-length",
        type=_positive("--context-length"),
        default=None,
        help=(
            "generate: cap on prompt + generated tokens (default: the model's "
            "max_position_embeddings); encode: longest input, longer ones are truncated"
        ),
    )
    add(
        "--query-template",
        type=_template("--query-template"),
        default=None,
        help="encode: the text of a query, e.g. 'query: {text}' ({text}, {instruction})",
    )
    add(
        "--doc-template",
        type=_template("--doc-template"),
        default=None,
        help="encode: the text of a document, e.g. 'passage: {text}'",
    )
    add(
        "--default-instruction",
        default=None,
        help="encode: the instruction of a query that brings none",
    )
    add(
        "--lora",
        dest="loras",
        action="append",
        type=_lora,
        default=[],
        metavar="NAME=FOLDER",
        help="generate: a LoRA adapter (a PEFT folder) served on the model, chosen per request "
        "by lora_path or model 'name:NAME'; repeat for more",
    )
    add(
        "--max-loras-per-batch",
        type=_positive("--max-loras-per-batch"),
        default=None,
        help="generate: SGLang's limit, accepted for the same configs; this engine generates "
        "one sequence at a time, each with its own adapter",
    )
    add(
        "--cuda-memory-fraction",
        type=_fraction,
        default=None,
        help="on CUDA: cap torch's allocator at this share of the device (0 < F <= 1), as "
        "the worker reserved it beside other models (default: no cap)",
    )
    add(
        "--no-normalize",
        dest="normalize",
        action="store_false",
        help="encode: return embeddings as pooled, not L2-normalised",
    )
    return parser


def parse_options(argv: Sequence[str] | None = None) -> EngineOptions:
    args = build_parser().parse_args(argv)
    return EngineOptions(
        model_path=args.model_path,
        host=args.host,
        port=args.port,
        task=cast(Task, args.task),
        served_model_name=args.served_model_name or args.model_path,
        dtype=args.dtype,
        device=args.device,
        threads=args.threads,
        max_batch_size=args.max_batch_size,
        revision=args.revision,
        context_length=args.context_length,
        query_template=args.query_template,
        doc_template=args.doc_template,
        default_instruction=args.default_instruction,
        normalize=args.normalize,
        loras=_unique(args.loras),
        max_loras_per_batch=args.max_loras_per_batch,
        cuda_memory_fraction=args.cuda_memory_fraction,
    )


def _fraction(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(
            f"--cuda-memory-fraction: {raw!r} is not a share above 0 and at most 1, e.g. 0.3"
        )
    return value


def _dtype(raw: str) -> str:
    try:
        return DTYPES[raw.strip().lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(
            f"{raw!r} is not a dtype; use one of auto, float32, bfloat16, float16"
        ) from None


def _lora(raw: str) -> tuple[str, str]:
    name, sep, folder = raw.partition("=")
    if not sep or not name.strip() or not folder.strip():
        raise argparse.ArgumentTypeError(f"--lora {raw!r}: write NAME=FOLDER")
    return name.strip(), folder.strip()


def _unique(loras: Sequence[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    names = [name for name, _ in loras]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise SystemExit(f"--lora: adapter names must be unique, got {', '.join(twice)} twice")
    return tuple(loras)


def _template(flag: str) -> Callable[[str], str]:
    def convert(raw: str) -> str:
        problem = check_template(raw)
        if problem is not None:
            raise argparse.ArgumentTypeError(f"{flag} {problem}")
        return raw

    return convert


def _port(raw: str) -> int:
    value = _int(raw, "--port")
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port; use 0..65535")
    return value


def _positive(flag: str) -> Callable[[str], int]:
    def convert(raw: str) -> int:
        value = _int(raw, flag)
        if value < 1:
            raise argparse.ArgumentTypeError(
                f"{value} is not allowed; {flag} takes an integer >= 1"
            )
        return value

    return convert


def _int(raw: str, flag: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not an integer ({flag})") from None
