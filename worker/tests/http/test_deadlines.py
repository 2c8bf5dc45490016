"""A request's deadlines: when each one is due, and which option it is."""

from __future__ import annotations

import pytest

from sie_worker.http.deadlines import Deadlines, Limit

FIRST = Limit("first_chunk_timeout_s", 0.05)


@pytest.mark.anyio
async def test_the_next_deadline_is_the_nearest_one_still_to_come() -> None:
    overall = Limit("overall_timeout_s", 2)
    deadlines = Deadlines(Limit("request_read_timeout_s", 1), first_chunk=FIRST, overall=overall)
    start = deadlines.started
    assert deadlines.next_due(first_seen=False) == (start + 0.05, FIRST)
    assert deadlines.next_due(first_seen=True) == (start + 2, overall)
    assert Deadlines(Limit("request_read_timeout_s", 1)).next_due(first_seen=False) is None
    later_first = Deadlines(None, first_chunk=Limit("first_chunk_timeout_s", 9), overall=overall)
    assert later_first.next_due(first_seen=False) == (later_first.started + 2, overall)
    assert deadlines.fixed
    assert not Deadlines(Limit("request_read_timeout_s", 1)).fixed
