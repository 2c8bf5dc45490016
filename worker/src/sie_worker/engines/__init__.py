"""Engine subprocesses the worker launches instead of SGLang (``python -m sie_worker.engines.X``).

Importing this package is cheap: torch and transformers are imported only on an engine's
run path, inside the engine subprocess, never in the worker process.
"""

from __future__ import annotations

__all__: list[str] = []
