"""The worker's own signals: SIGTERM drains streams then stops engines; SIGKILL leaves nothing.

What the worker does (also reported in the issue note):

- SIGTERM with streams in flight: it stops accepting, lets every stream finish (within the
  grace period, ``SIE_DRAIN_TIMEOUT_S``), then stops every engine and exits 0;
- SIGTERM with a stream that outlasts the grace period: the stream is cut when the grace
  period ends, the engines are stopped all the same, and the worker exits 0;
- SIGKILL: engines die with it (parent-death signal) and so do their rank processes.
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

from tests.reliability._support import Launcher, Worker, stream_events
from tests.support.worker_fixtures import fake_model, wait_until

_RANKS = {"FAKE_ENGINE_CHILDREN": "2", "FAKE_ENGINE_TOKEN_DELAY_S": "0.05"}


class _Streams:
    """Streams running in threads; ``events[i]`` grows as stream i receives events."""

    def __init__(self, worker: Worker, models: list[str], tokens: int) -> None:
        self.events: list[list[str]] = [[] for _ in models]
        self.results: list[tuple[int, list[str]] | BaseException | None] = [None] * len(models)
        self.threads = [
            threading.Thread(target=self._run, args=(worker, i, m, tokens), daemon=True)
            for i, m in enumerate(models)
        ]
        for thread in self.threads:
            thread.start()

    def _run(self, worker: Worker, index: int, model: str, tokens: int) -> None:
        def seen(_: int, payload: str) -> None:
            self.events[index].append(payload)

        try:
            self.results[index] = stream_events(worker, model, on_event=seen, tokens=tokens)
        except BaseException as exc:  # a cut connection: reported, not raised in the thread
            self.results[index] = exc

    def wait_started(self, events: int = 3) -> None:
        wait_until(lambda: all(len(e) >= events for e in self.events), timeout=30)

    def join(self, timeout: float = 60.0) -> list[Any]:
        for thread in self.threads:
            thread.join(timeout)
        assert not any(t.is_alive() for t in self.threads), "a stream hung after the worker left"
        return self.results


def _load(worker: Worker, *models: str) -> None:
    with worker.client() as client:
        for model in models:
            client.post(f"/v1/models/{model}/load").raise_for_status()


def test_sigterm_lets_every_stream_finish_then_stops_engines_and_ranks_and_exits_0(
    launcher: Launcher,
) -> None:
    worker = launcher.start(
        [fake_model("org/a", env=_RANKS), fake_model("org/b", env=_RANKS)],
        devices="cuda:0,cuda:1",
    )
    _load(worker, "org/a", "org/b")
    engines = worker.engines()
    assert set(engines) == {"org/a", "org/b"}
    worker.engine_pids()  # note the ranks' process groups
    streams = _Streams(worker, ["org/a", "org/b", "org/a", "org/b"], tokens=40)
    streams.wait_started()
    assert worker.stop(signal.SIGTERM, timeout=60) == 0
    for result in streams.join():
        assert isinstance(result, tuple), result
        status, events = result
        assert status == 200
        assert events[-1] == "[DONE]"  # sent by the engine: it outlived the stream
        assert len(events) == 40 + 1  # every token (the last with the finish reason), [DONE]
    assert worker.survivors() == []
    log = worker.logs()
    assert "Traceback" not in log


def test_sigterm_with_a_stream_longer_than_the_grace_period_cuts_it_and_still_exits_0(
    launcher: Launcher,
) -> None:
    worker = launcher.start(
        [fake_model("org/a", env=_RANKS)], devices="cuda:0", env={"SIE_DRAIN_TIMEOUT_S": "2"}
    )
    _load(worker, "org/a")
    worker.engine_pids()
    streams = _Streams(worker, ["org/a"], tokens=2000)  # 100 s at 50 ms a token
    streams.wait_started()
    started = time.monotonic()
    assert worker.stop(signal.SIGTERM, timeout=60) == 0
    stopped_s = time.monotonic() - started
    (result,) = streams.join()
    if isinstance(result, tuple):
        assert "[DONE]" not in result[1]
    assert stopped_s < 45  # the grace period, not the 100 s stream, bounds the exit
    assert worker.survivors() == []


def test_sigkill_leaves_no_engine_and_no_rank_process_behind(launcher: Launcher) -> None:
    worker = launcher.start(
        [fake_model("org/a", env=_RANKS), fake_model("org/b", width=2, env=_RANKS)],
        devices="cuda:0,cuda:1,cuda:2",
    )
    _load(worker, "org/a", "org/b")
    streams = _Streams(worker, ["org/a"], tokens=2000)
    streams.wait_started()
    pids = worker.engine_pids()
    assert len(pids) == 6  # two engines, two ranks each
    worker.stop(signal.SIGKILL)
    streams.join()
    assert worker.survivors() == []
