"""The worker in front of a real SGLang engine on cpu devices: tokens/s and time to first
token through the worker against the engine's own port, side by side, and what the worker
adds to a load (the method: :mod:`tests.bench._engine_bench`).

One worker (``SIE_BUNDLE=sglang-cu130``, ``SIE_DEVICES=cpu:0,cpu:1``) serves the tiny Llama of
``tests/support/tiny_models.py`` in float32 with SGLang 0.5.23 (``.venv-sglang``, with the
tests' stand-in for its CPU kernel module).

**Load overhead**: the model as a real TP=2 engine (two scheduler ranks, one per core).

**Throughput and TTFT**: the same model at width 1 on ``cpu:0``: the engine (its launcher,
scheduler and detokenizer, all on the block's core 0, as the worker places them) against the
worker and this client on core 1, for 1 and 8 concurrent streams.

Writes ``tests/bench/out/sglang.json`` and the ``## SGLang behind the worker`` section of
``docs/benchmarks.md`` (unless ``--no-record``).

    .venv/bin/python -m tests.bench.bench_sglang [--rounds 41] [--tokens 64] [--no-record]
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.bench._bench import ROOT
from tests.bench._engine_bench import EngineBench, table
from tests.bench._engine_bench import main as run
from tests.support.sglang_engine import SGLANG_BUNDLE, sglang_command, sglang_model

__all__ = ["SECTION", "main"]

SECTION = "## SGLang behind the worker"
STREAMS = (1, 8)
# What earlier runs showed, for the reader of one run's figures.
HISTORY = (
    "How it was measured before: one TTFT per 64-token round, each round on a new client "
    "connection, could not tell a few ms apart (the engine's own TTFT then varied from 26 to "
    "80 ms between requests; five runs of 7-41 rounds on 2026-12-07 gave +3.6 to +12.4 ms "
    "added). With the TTFT samples, two runs before this one (kept-alive clients for the "
    "samples, a new connection per round) gave +2.0 and +2.2 ms added and 92.9% and 96.3% "
    "of direct tokens/s, and one after it (as this one) +2.1 ms and 97.5%."
)
ENGINE_MODULE = "sglang.launch_server"


def section(result: dict[str, Any], command: str) -> str:
    by = {(c["path"], c["streams"]): c for c in result["cells"]}
    one = by[("worker", 1)]
    one_direct = by[("direct", 1)]
    ratio = one["tokens_per_s"] / one_direct["tokens_per_s"]
    added_ttft = (one["ttft_p50_s"] - one_direct["ttft_p50_s"]) * 1000
    load = result["load"]
    lines = [
        SECTION,
        "",
        f"`{command}`, {result['when']}, {result['machine']}. A real SGLang (SGLang "
        f"{result['sglang']} on cpu devices, tiny Llama, float32) at width 1, its launcher, "
        "scheduler and detokenizer on core 0 (the block's core, as the worker places them), "
        f"the worker and the client on core 1; {result['tokens']} tokens per streamed "
        f"completion, medians of {result['rounds']} alternating rounds per path; one "
        f"stream's TTFT the median of {result['ttft_samples']} 2-token streams per path, "
        "alternating one by one on kept-alive clients.",
        "",
        *table(result["cells"], STREAMS, "SGLang launcher"),
        "",
        f"Load of the TP=2 model: {load['load_s']:.2f} s from the request to the answer; the "
        "engine's own start-up (its process's start to its first healthy `/health`, which in "
        f"SGLang runs a one-token generation) {load['engine_s']:.2f} s; the worker added "
        f"**{load['added_s']:.2f} s** (resolving the options, reading the model's shape for "
        "its KV cache and placing it before the spawn, readiness polling and registration "
        "after).",
        "",
        f"Targets (issue 46): worker >= 95% of direct tokens/s at 1 stream ({ratio:.1%}); "
        f"<= 5 ms added to TTFT p50 ({added_ttft:+.1f} ms); <= 1 s added to a load beyond the "
        f"engine's own start ({load['added_s']:.2f} s). {HISTORY} The load's figure has the "
        "resolution of SGLang's `/health`, a generation of a second or more per call: the "
        "engine's start and the worker's readiness poll see the same first 200, and what the "
        "worker adds is within it.",
    ]
    return "\n".join(lines) + "\n"


def _config(model_id: str, model_dir: Path, width: int) -> dict[str, Any]:
    """The model at ``width``, its batch as wide as the most streams measured (none waits)."""
    return sglang_model(
        model_id, model_dir, width=width, args=["--max-running-requests", str(max(STREAMS))]
    )


def main(argv: Sequence[str] | None = None) -> int:
    env = {
        "SIE_BUNDLE": SGLANG_BUNDLE,
        "SIE_SGLANG_COMMAND": sglang_command(),
        "SIE_DEVICES": "cpu:0,cpu:1",
    }
    bench = EngineBench(
        name="sglang",
        module=ENGINE_MODULE,
        env=env,
        config=_config,
        python=ROOT / ".venv-sglang" / "bin" / "python",
        section=section,
        streams=STREAMS,
        # A round of one stream gives one TTFT sample: many rounds for a median that holds
        # still (they are cheap: the two loads take most of the run).
        rounds=41,
    )
    return run(bench, argv, __doc__.splitlines()[0])


if __name__ == "__main__":
    sys.exit(main())
