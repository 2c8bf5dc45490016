"""Run ``sie-worker serve`` unchanged and, at exit, record which heavy modules it imported.

    python tests/bench/_serve_probe.py OUT_FILE serve --config-dir DIR --port N

The worker runs through ``runpy`` exactly as ``python -m sie_worker`` runs it; an ``atexit``
hook writes ``{"heavy": [...], "modules": N}`` to OUT_FILE after the server has stopped.
"""

from __future__ import annotations

import atexit
import json
import runpy
import sys
from pathlib import Path

__all__ = ["HEAVY"]

HEAVY = ("torch", "transformers", "sentence_transformers", "sglang", "numpy", "safetensors")


def _record(path: Path) -> None:
    heavy = sorted({name.split(".")[0] for name in sys.modules} & set(HEAVY))
    path.write_text(json.dumps({"heavy": heavy, "modules": len(sys.modules)}))


if __name__ == "__main__":
    out = Path(sys.argv[1])
    atexit.register(_record, out)
    sys.argv = ["sie-worker", *sys.argv[2:]]
    runpy.run_module("sie_worker", run_name="__main__", alter_sys=True)
