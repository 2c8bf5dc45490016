"""Port bookings: a load holds the ports it picked until its engine runs or the load ends."""

from __future__ import annotations

import pytest

from sie_worker.worker.launcher import ports
from sie_worker.worker.launcher.start import Booking, PortBook

SMALL = range(30390, 30400)


@pytest.fixture(autouse=True)
def every_port_binds(monkeypatch: pytest.MonkeyPatch) -> None:
    # Other processes on the machine may hold ports of the range: only bookings count here.
    monkeypatch.setattr(ports, "port_is_free", lambda port, host="127.0.0.1": True)


def test_a_booked_port_is_in_use_until_the_booking_ends() -> None:
    book = PortBook(lambda: {30010})
    with book.booking() as first:
        port = first.pick(ports.ENGINE_PORTS)
        assert port in book.in_use()
        assert port != 30010
        with book.booking() as second:
            assert second.pick(ports.ENGINE_PORTS) not in {port, 30010}
        assert port in book.in_use()
    assert book.in_use() == {30010}


def _fail_after_booking(booking: Booking) -> None:
    booking.hold(30450)
    booking.pick(ports.RENDEZVOUS_PORTS)
    raise RuntimeError("engine failed")


def test_held_ports_are_given_back_when_the_load_fails() -> None:
    book = PortBook(set)
    with book.booking() as booking, pytest.raises(RuntimeError):
        _fail_after_booking(booking)
    assert book.in_use() == set()


def test_two_bookings_never_pick_the_same_port() -> None:
    book = PortBook(set)
    with book.booking() as a, book.booking() as b:
        picked = [(a if i % 2 else b).pick(SMALL) for i in range(len(SMALL))]
        assert sorted(picked) == list(SMALL)
        with pytest.raises(ports.NoFreePort):
            a.pick(SMALL)
