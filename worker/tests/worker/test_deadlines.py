"""A request's deadlines: which limit a slow step hits, and the read timeout they leave."""

from __future__ import annotations

import asyncio

import pytest

from sie_worker.config.runtime import Timeouts
from sie_worker.worker.deadlines import DeadlineHit, Deadlines


@pytest.mark.parametrize(
    ("cap", "inter", "expected"),
    [
        (None, None, (None, "request_read_timeout_s")),
        (30.0, None, (30.0, "request_read_timeout_s")),
        (30.0, 5.0, (5.0, "inter_chunk_timeout_s")),
        (2.0, 5.0, (2.0, "request_read_timeout_s")),
        (None, 5.0, (5.0, "inter_chunk_timeout_s")),
    ],
)
@pytest.mark.anyio
async def test_the_read_timeout_is_the_smaller_of_the_cap_and_the_inter_chunk_limit(
    cap: float | None, inter: float | None, expected: tuple[float | None, str]
) -> None:
    deadlines = Deadlines(cap, Timeouts(inter_chunk_s=inter))
    assert (deadlines.read_s, deadlines.read_name) == expected


@pytest.mark.anyio
async def test_the_first_chunk_limit_applies_until_a_chunk_has_come() -> None:
    deadlines = Deadlines(None, Timeouts(first_chunk_s=0.05, overall_s=5))
    with pytest.raises(DeadlineHit) as hit:
        await deadlines.first(asyncio.sleep(1))
    assert (hit.value.name, hit.value.seconds) == ("first_chunk_timeout_s", 0.05)
    deadlines = Deadlines(None, Timeouts(first_chunk_s=0.5, overall_s=5))
    assert await deadlines.first(asyncio.sleep(0, "a")) == "a"
    assert await deadlines.first(asyncio.sleep(0.6, "b")) == "b"  # later chunks: overall only


@pytest.mark.anyio
async def test_the_overall_limit_bounds_every_step() -> None:
    deadlines = Deadlines(None, Timeouts(overall_s=0.1))
    await deadlines.overall(asyncio.sleep(0.02))
    with pytest.raises(DeadlineHit, match="overall_timeout_s"):
        await deadlines.first(asyncio.sleep(1))


@pytest.mark.anyio
async def test_a_step_s_own_timeout_is_not_mistaken_for_a_deadline() -> None:
    async def times_out() -> None:
        raise TimeoutError("the step's own")

    deadlines = Deadlines(None, Timeouts(overall_s=5))
    with pytest.raises(TimeoutError, match="the step's own"):
        await deadlines.overall(times_out())
