"""The backend record the router and the gateway share: dispatch, poll and mark-down rules,
and the poll loop."""

from __future__ import annotations

import anyio
import pytest

from sie_worker.backends.table import Backend, poll_loop
from sie_worker.http.poll import PollError

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_a_load_stays_pending_across_a_poll_while_its_request_is_in_flight() -> None:
    b = Backend("http://w")
    b.note_dispatch("a", 1.0, loads=True)
    b.note_dispatch("b", 1.0, loads=False)  # already ready there: nothing to record
    assert (b.outstanding, dict(b.inflight_by_model)) == (2, {"a": 1, "b": 1})
    assert b.accept_poll(2.0, {"a": "unloaded"}.get)
    assert b.pending == [(1.0, "a", False)]  # the worker had not seen it yet
    assert b.accept_poll(3.0, {"a": "loading"}.get)
    assert b.pending == []  # now it has
    assert not b.accept_poll(2.5, {}.get)  # an older poll that finished late
    b.note_finish("a", 4.0, served=True)
    assert (b.outstanding, dict(b.inflight_by_model), b.pending) == (
        1,
        {"b": 1},
        [(4.0, "a", True)],
    )


def test_failed_polls_and_refusals_take_a_backend_down_and_abort_its_requests() -> None:
    b = Backend("http://w")
    b.accept_poll(0.0, {}.get)
    aborted: list[str] = []
    b.aborts.add(lambda: aborted.append("x"))
    assert not b.note_poll_failure(PollError("slow"), 2)
    assert b.note_poll_failure(PollError("slow"), 2)
    assert Backend("http://v").note_poll_failure(PollError("refused", refused=True), 3)
    b.note_dispatch("a", 1.0, loads=True)
    assert b.take_down("gone")
    assert (b.answering, b.down, b.pending, aborted, b.last_error) == (
        False,
        True,
        [],
        ["x"],
        "gone",
    )
    assert not b.take_down("again")  # it was not answering


async def test_the_poll_loop_polls_on_its_interval_and_at_once_when_woken() -> None:
    b = Backend("http://w")
    seen: list[str] = []
    answers = iter(["one", PollError("down"), "three"])

    async def poll() -> str:
        answer = next(answers)
        if isinstance(answer, PollError):
            raise answer
        return answer

    clock = iter(range(100))
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                lambda: poll_loop(
                    b,
                    poll,
                    lambda at, answer: seen.append(f"{at}:{answer}"),
                    lambda error: seen.append(str(error)),
                    interval_s=60,
                    clock=lambda: float(next(clock)),
                    until=lambda: len(seen) >= 3,
                )
            )
            for _ in range(3):  # the third wake finds it done: the loop ends
                await anyio.wait_all_tasks_blocked()
                b.wake.set()
    assert seen == ["0.0:one", "down", "2.0:three"]
