"""The engines the worker runs: one package per engine family (SGLang, vLLM, llama.cpp, and
the default engine), each behind the protocol of :mod:`~sie_worker.engines.family`, listed in
:mod:`~sie_worker.engines.registry`; and the default engine's own process
(``python -m sie_worker.engines.transformers``).

Importing this package is cheap: torch and transformers are imported only on the default
engine's run path, inside its subprocess, never in the worker process.
"""

from __future__ import annotations

__all__: list[str] = []
