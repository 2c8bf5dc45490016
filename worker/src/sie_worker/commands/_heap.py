"""The cyclic garbage collector's settings for a long-running server (serve, route, gateway).

A relayed request allocates thousands of short-lived objects and a stream keeps a few
hundred for its whole life (about a second at 50 tokens/s), so with CPython's default
thresholds (700, 10, 10) each hop ran some 50 young collections a second and, every few
seconds, a full one over its whole heap: 5-17% of a hop's CPU at 256 streams, measured
with ``gc.callbacks`` (``docs/benchmarks.md``, Gateway; about 4% after). Once the app is
built, what exists (modules, configs, the app itself) is frozen, never scanned again, and
young collections run per 10,000 allocations instead of 700 (each then takes a few ms);
objects freed by their reference count, nearly all of them, never wait for the collector
either way.
"""

from __future__ import annotations

import gc

__all__ = ["settle_heap"]

YOUNG_THRESHOLD = 10_000


def settle_heap() -> None:
    """Freeze what the process built at start and make young collections rarer."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, 20, 20)
