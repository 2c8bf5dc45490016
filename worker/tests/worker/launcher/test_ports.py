"""Engine and rendezvous ports: in range, never one in use, a clear error when none is left."""

from __future__ import annotations

import random
import socket
from collections.abc import Iterator

import pytest

from sie_worker.errors import LoadFailed
from sie_worker.worker.launcher.ports import (
    ENGINE_PORTS,
    RENDEZVOUS_PORTS,
    NoFreePort,
    pick_port,
    port_is_free,
)


@pytest.fixture
def listener() -> Iterator[int]:
    """A real socket listening on a port of the engine range."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    for port in ENGINE_PORTS:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        sock.listen()
        try:
            yield port
        finally:
            sock.close()
        return
    pytest.skip("every engine port is taken on this machine")


def test_ranges_are_the_documented_ones() -> None:
    assert (ENGINE_PORTS.start, ENGINE_PORTS.stop) == (30000, 30400)
    assert (RENDEZVOUS_PORTS.start, RENDEZVOUS_PORTS.stop) == (30400, 30500)


@pytest.mark.parametrize("candidates", [ENGINE_PORTS, RENDEZVOUS_PORTS])
def test_picked_ports_are_in_range_and_bindable(candidates: range) -> None:
    port = pick_port(candidates)
    assert port in candidates
    assert port_is_free(port)


def test_ports_in_use_by_this_worker_are_skipped() -> None:
    taken = set(range(30400, 30499))
    assert pick_port(RENDEZVOUS_PORTS, taken) == 30499


def test_a_port_another_process_listens_on_is_skipped(listener: int) -> None:
    assert not port_is_free(listener)
    if not port_is_free(listener + 1):
        pytest.skip(f"port {listener + 1} is taken on this machine")
    window = range(listener, listener + 2)
    for seed in range(10):
        assert pick_port(window, rng=random.Random(seed)) == listener + 1


def test_only_a_listener_left_means_no_free_port(listener: int) -> None:
    with pytest.raises(NoFreePort) as caught:
        pick_port(range(listener, listener + 1))
    assert isinstance(caught.value, LoadFailed)
    assert f"no free port in {listener}-{listener}" in caught.value.message


def test_exhausted_range_is_a_load_failure_naming_the_range() -> None:
    with pytest.raises(NoFreePort, match="no free port in 30400-30499"):
        pick_port(RENDEZVOUS_PORTS, set(RENDEZVOUS_PORTS))


def test_scan_starts_at_a_random_offset_and_wraps() -> None:
    picks = {pick_port(RENDEZVOUS_PORTS, rng=random.Random(seed)) for seed in range(8)}
    assert len(picks) > 1
    assert pick_port(range(30400, 30410), set(range(30401, 30410)), rng=random.Random(7)) == 30400
