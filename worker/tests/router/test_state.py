"""Slot state: parsing worker answers, optimistic records against polls, leaving rotation."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.bench.bench_slot_decision import view_rebuilding_every_model

from sie_worker.backends.answers import BackendPoll, DeviceEntry, ModelEntry
from sie_worker.backends.prefix import prompt_blocks
from sie_worker.http.poll import PollError
from sie_worker.router.metrics import RouterMetrics
from sie_worker.router.policy import Decision, ModelView
from sie_worker.router.settings import RouterSettings
from sie_worker.router.state import SlotTable, slot_view_parts


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def table(slots: int = 2, **kw: object) -> tuple[SlotTable, Clock]:
    settings = RouterSettings(worker_ports=tuple(range(9000, 9000 + slots)), **kw)  # type: ignore[arg-type]
    clock = Clock()
    return SlotTable(settings, RouterMetrics(slots), clock=clock), clock


def _up(t: SlotTable, slot: int) -> bool:
    return t.slots[slot].up


FREE = (("cuda:0", None),)
MODELS = {"a": ModelView(), "b": ModelView()}


def test_a_poll_gives_the_policy_models_devices_and_the_memory_the_worker_reports() -> None:
    answer = BackendPoll(
        {"a": ModelEntry("ready", 2, True, 5.0, 3, 7), "b": ModelEntry()},
        (DeviceEntry("cuda:0", ("a",), None, 10, 7), DeviceEntry("cuda:1")),
        True,
    )
    models, devices, room = slot_view_parts(answer)
    assert models == {
        "a": ModelView("ready", 2, True, 5.0, 3, memory_bytes=7),
        "b": ModelView("unloaded", 1),
    }
    assert (devices, room) == ((("cuda:0", "a"), ("cuda:1", None)), (3, None))


def test_dispatch_is_visible_until_a_poll_started_after_it_lands() -> None:
    t, clock = table()
    t.apply_poll(0, clock(), dict(MODELS), FREE, True)
    poll_started = clock()
    t.dispatched(0, "a", "free_device")
    assert t.views()[0].state_of("a") == "loading"
    t.apply_poll(0, poll_started, dict(MODELS), FREE, True)  # began before the dispatch
    assert t.views()[0].state_of("a") == "loading"
    t.apply_poll(0, clock(), {"a": ModelView("ready"), "b": ModelView()}, (("cuda:0", "a"),), True)
    assert t.slots[0].pending == []
    assert t.views()[0].state_of("a") == "ready"


def test_a_dispatch_in_flight_outlives_a_poll_answered_before_the_worker_saw_it() -> None:
    t, clock = table()
    t.apply_poll(0, clock(), dict(MODELS), FREE, True)
    t.apply_poll(1, clock(), dict(MODELS), FREE, True)
    t.dispatched(0, "a", "free_device")
    # The poll started after the dispatch, but the worker had not received the request yet.
    t.apply_poll(0, clock(), dict(MODELS), FREE, True)
    assert t.views()[0].state_of("a") == "loading"
    assert t.decide("a") == Decision(0, "loading")
    t.finished(0, "a", changed=True, served=False)
    t.apply_poll(0, clock(), dict(MODELS), FREE, True)
    assert t.slots[0].pending == []
    assert t.views()[0].state_of("a") == "unloaded"


def test_a_served_request_marks_its_model_ready_before_the_next_poll() -> None:
    t, clock = table()
    t.apply_poll(0, clock(), dict(MODELS), FREE, True)
    t.dispatched(0, "a", "free_device")
    t.finished(0, "a", changed=True, served=True)
    assert t.views()[0].state_of("a") == "ready"
    assert t.decide("a").reason == "ready"  # type: ignore[union-attr]


def test_a_failed_request_leaves_its_model_loading_until_the_poll_says_otherwise() -> None:
    t, clock = table()
    t.apply_poll(0, clock(), dict(MODELS), FREE, True)
    t.dispatched(0, "a", "free_device")
    t.finished(0, "a", changed=True, served=False)
    assert t.views()[0].state_of("a") == "loading"
    t.apply_poll(0, clock(), {"a": ModelView("failed"), "b": ModelView()}, FREE, True)
    assert t.views()[0].state_of("a") == "failed"


def test_outstanding_and_per_model_inflight_follow_dispatch_and_finish() -> None:
    t, clock = table()
    t.apply_poll(0, clock(), {"a": ModelView("ready")}, (("cuda:0", "a"),), True)
    t.dispatched(0, "a", "ready")
    t.dispatched(0, "a", "ready")
    view = t.views()[0]
    assert (view.outstanding, view.models["a"].inflight) == (2, 2)
    t.finished(0, "a", changed=False, served=True)
    t.finished(0, "a", changed=False, served=True)
    view = t.views()[0]
    assert (view.outstanding, view.models["a"].inflight) == (0, 0)


_NAMES = st.sampled_from([f"m{i}" for i in range(6)])


@given(
    polled=st.dictionaries(
        _NAMES,
        st.builds(
            ModelView,
            state=st.sampled_from(["unloaded", "loading", "ready", "failed"]),
            inflight=st.integers(0, 4),
        ),
    ),
    dispatched=st.lists(st.tuples(_NAMES, st.sampled_from(["ready", "loading", "load"]))),
    finished=st.lists(st.tuples(st.integers(0, 20), st.booleans(), st.booleans())),
)
def test_a_view_counts_the_larger_inflight_of_worker_and_router_for_every_model(
    polled: dict[str, ModelView],
    dispatched: list[tuple[str, str]],
    finished: list[tuple[int, bool, bool]],
) -> None:
    t, clock = table(1)
    t.apply_poll(0, clock(), polled, FREE, True)
    for model, reason in dispatched:
        t.dispatched(0, model, reason)
    for index, changed, served in finished:
        if index < len(dispatched) and dispatched[index][0]:
            t.finished(0, dispatched[index][0], changed=changed, served=served)
            dispatched[index] = ("", "")  # each request ends once
    state = t.slots[0]
    # The view as its definition says, built the long way: every model rebuilt.
    expected = view_rebuilding_every_model(state)
    view = state.view()
    assert view == expected
    assert list(view.models) == list(expected.models)


def test_slot_leaves_rotation_after_repeated_poll_failures_and_aborts_its_requests() -> None:
    t, clock = table(down_after_failures=2)
    t.apply_poll(0, clock(), dict(MODELS), FREE, True)
    aborted: list[int] = []
    t.slots[0].aborts.add(lambda: aborted.append(0))
    t.poll_failed(0, PollError("timed out"))
    assert _up(t, 0)
    assert aborted == []
    t.poll_failed(0, PollError("timed out"))
    assert not _up(t, 0)
    assert aborted == [0]
    assert t.decide("a") is None
    t.apply_poll(0, clock(), dict(MODELS), FREE, True)
    assert _up(t, 0)


def test_refused_connection_takes_the_slot_out_at_once() -> None:
    t, clock = table(down_after_failures=5)
    t.apply_poll(0, clock(), dict(MODELS), FREE, True)
    t.poll_failed(0, PollError("refused", refused=True))
    assert not _up(t, 0)


def test_first_round_of_polls_is_signalled_once_every_slot_answered_or_failed() -> None:
    t, clock = table(slots=2)
    t.apply_poll(0, clock(), dict(MODELS), FREE, True)
    assert not t.polled_once.is_set()
    t.poll_failed(1, PollError("refused", refused=True))
    assert t.polled_once.is_set()
    assert t.any_ready()


def test_a_prompt_goes_back_to_the_slot_that_holds_its_prefix_until_that_slot_leaves() -> None:
    t, clock = table(3)
    for s in range(3):
        t.apply_poll(s, clock(), {"a": ModelView("ready")}, FREE, True)
    config = t.settings.prefix
    history = {"messages": [{"role": "system", "content": "agent " * 100}]}
    first = prompt_blocks(config, "a", history)
    # Slot 2 is the least busy, so it gets the first turn (ready, least outstanding).
    t.dispatched(0, "a", "ready")
    t.dispatched(1, "a", "ready")
    assert t.decide("a", prefix=first) == Decision(2, "ready")
    t.sent(2, first)
    t.dispatched(2, "a", "ready")
    history["messages"].append({"role": "user", "content": "next turn " * 40})
    second = prompt_blocks(config, "a", history)
    assert t.decide("a", prefix=second) == Decision(2, "prefix")
    # Over the load bound (1.25 x the mean), the usual order decides.
    for _ in range(3):
        t.dispatched(2, "a", "ready")
    assert t.decide("a", prefix=second) == Decision(0, "ready")
    t.mark_down(2, "gone")
    assert t.prefixes.match(second) == {}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_a_prefix_request_to_a_ready_model_is_no_load_and_its_end_polls_nothing() -> None:
    t, clock = table()
    t.apply_poll(0, clock(), {"a": ModelView("ready"), "b": ModelView("loading")}, FREE, True)
    assert not t.loads(0, "a", "prefix")
    assert t.loads(0, "b", "prefix")  # still loading: its end is worth a poll
    assert t.loads(1, "a", "prefix")  # not polled yet: nothing says it is ready
    assert (t.loads(0, "a", "ready"), t.loads(0, None, "free_device")) == (False, False)
    async with t.attempt(Decision(0, "prefix"), "a") as attempt:
        assert t.slots[0].pending == []
        assert t.metrics.queued._value.get() == 0
        attempt.answered(200)
    assert not t.slots[0].wake.is_set()
    async with t.attempt(Decision(0, "prefix"), "b"):
        assert t.metrics.queued._value.get() == 1
    assert t.slots[0].wake.is_set()
