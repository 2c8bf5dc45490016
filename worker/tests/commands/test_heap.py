"""The servers' collector settings (run in a child process: they are process-wide)."""

from __future__ import annotations

import json
import subprocess
import sys

from sie_worker.commands._heap import YOUNG_THRESHOLD


def test_settle_heap_freezes_what_exists_and_makes_young_collections_rarer() -> None:
    code = (
        "import gc, json\n"
        "from sie_worker.commands._heap import settle_heap\n"
        "before = gc.get_freeze_count()\n"
        "settle_heap()\n"
        "print(json.dumps([before, gc.get_freeze_count(), gc.get_threshold()]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    before, frozen, threshold = json.loads(out.stdout)
    assert before == 0
    assert frozen > 1000  # the modules and everything else built so far
    assert threshold == [YOUNG_THRESHOLD, 20, 20]
