"""The default engine: one transformers / sentence-transformers model behind OpenAI-style HTTP.

The worker launches it like SGLang, as a subprocess on 127.0.0.1 with its device mask::

    python -m sie_worker.engines.transformers --model-path DIR_OR_ID --host 127.0.0.1 \\
        --port N --task {encode,generate,score} [--served-model-name ID] [--dtype ...] \\
        [--device auto|cpu|cuda] [--threads N] [--max-batch-size N] [--revision REV] \\
        [--context-length N] [--query-template T] [--doc-template T] \\
        [--default-instruction I] [--no-normalize]

It serves ``GET /health`` (503 while loading, 200 once the model is loaded), ``GET
/v1/models``, ``POST /v1/embeddings`` (task encode; beside OpenAI's fields it takes
``is_query`` and ``instruction``, one or one per input, and ``query_template``,
``doc_template``, ``default_instruction``, ``normalize``, shaping each text as SIE does),
``POST /v1/rerank`` (task score, SGLang's shape: ``{query, documents}`` -> ``[{index,
score}]``, best first), ``POST /v1/completions`` and ``/v1/chat/completions`` (task
generate; ``stream: true`` sends server-sent events ending with ``data: [DONE]``).
Errors are ``{"error": {"message", "type", "code", "param"}}``.
It never reaches a model hub for a local directory, and honours ``HF_HUB_OFFLINE=1``.
Importing this module is cheap; torch is imported only when :func:`main` runs.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    from sie_worker.engines.transformers._options import parse_options

    options = parse_options(argv)
    # why: no timestamp; the worker stamps each line it relays, prefixed with the model id
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
    )
    # why: the worker relays this log line by line; progress bars only add noise there
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from sie_worker.engines.transformers._server import serve

    return serve(options)
