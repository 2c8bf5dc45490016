"""A request's deadlines: which limit a slow step hits, and when each one is due."""

from __future__ import annotations

import asyncio

import pytest

from sie_worker.http.deadlines import DeadlineHit, Deadlines, Limit

FIRST = Limit("first_chunk_timeout_s", 0.05)


@pytest.mark.anyio
async def test_the_first_chunk_limit_applies_until_a_chunk_has_come() -> None:
    deadlines = Deadlines(None, first_chunk=FIRST, overall=Limit("overall_timeout_s", 5))
    with pytest.raises(DeadlineHit) as hit:
        await deadlines.first(asyncio.sleep(1))
    assert (hit.value.name, hit.value.seconds) == ("first_chunk_timeout_s", 0.05)
    deadlines = Deadlines(None, first_chunk=Limit("first_chunk_timeout_s", 0.5))
    assert await deadlines.first(asyncio.sleep(0, "a")) == "a"
    assert await deadlines.first(asyncio.sleep(0.6, "b")) == "b"  # later chunks: no limit


@pytest.mark.anyio
async def test_the_overall_limit_bounds_every_step() -> None:
    deadlines = Deadlines(None, overall=Limit("overall_timeout_s", 0.1))
    await deadlines.overall_step(asyncio.sleep(0.02))
    with pytest.raises(DeadlineHit, match="overall_timeout_s"):
        await deadlines.first(asyncio.sleep(1))


@pytest.mark.anyio
async def test_a_step_s_own_timeout_is_not_mistaken_for_a_deadline() -> None:
    async def times_out() -> None:
        raise TimeoutError("the step's own")

    deadlines = Deadlines(None, overall=Limit("overall_timeout_s", 5))
    with pytest.raises(TimeoutError, match="the step's own"):
        await deadlines.overall_step(times_out())


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
    assert deadlines.fixed and not Deadlines(Limit("request_read_timeout_s", 1)).fixed
