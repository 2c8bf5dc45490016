"""tests/bench/bench_slot_decision.py compares like with like: both ways build the same views."""

from __future__ import annotations

import json

import pytest
from sie_worker.router.state import SlotState

from tests.bench import bench_slot_decision
from tests.bench.bench_slot_decision import table_of, view_rebuilding_every_model


@pytest.mark.parametrize(("slots", "models"), [(1, 1), (4, 20), (8, 50)])
def test_the_long_way_builds_the_views_the_router_builds(slots: int, models: int) -> None:
    table = table_of(slots, models)
    for state in table.slots:
        assert view_rebuilding_every_model(state) == SlotState.view(state)
        assert state.view().models["m0"].inflight == 3  # the router's count, above the 2 polled


def test_a_small_run_writes_one_cell_per_pod_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    written: dict[str, object] = {}
    monkeypatch.setattr(
        bench_slot_decision, "write_result", lambda name, data: written.update({name: data})
    )
    argv = ["--decisions", "5", "--repeats", "1", "--slots", "1", "2", "--models", "1", "3"]
    argv += ["--prefix-decisions", "20", "--prefix-index-blocks", "300"]
    assert bench_slot_decision.main(argv) == 0
    cells = json.loads(json.dumps(written["slot_decision"]))["cells"]
    assert [(c["slots"], c["models"]) for c in cells] == [(1, 1), (1, 3), (2, 1), (2, 3)]
    assert all(c["now_us"] > 0 and c["before_us"] > 0 for c in cells)
    prefix = json.loads(json.dumps(written["slot_decision"]))["prefix"]
    assert prefix["index_blocks"] == 300  # full
    assert prefix["gateway"]["p99_us"] > 0
    assert prefix["router"]["p99_us"] > 0
    assert prefix["index_bytes"] > 0
