"""What a hop passes on of a request's and an answer's headers (RFC 9110 7.6.1): the
hop-by-hop headers and every header ``Connection`` names stay behind, and so does what the
hop writes or answers itself; everything else goes on unchanged and in order."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sie_worker.http.headers import (
    HOP_BY_HOP,
    SET_BY_SERVER,
    forward_headers,
    named_by_connection,
    relayed_headers,
)

_TOKEN = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=12).filter(
    lambda t: t.strip("-") == t
)
_NAMES = st.one_of(
    _TOKEN,
    st.sampled_from(
        sorted(HOP_BY_HOP | SET_BY_SERVER | {"host", "content-length", "expect", "x-sie-slot"})
    ),
)
_CASED = _NAMES.flatmap(lambda n: st.sampled_from([n, n.upper(), n.title()]))
_HEADERS = st.lists(st.tuples(_CASED, st.text(alphabet="abc ,-", max_size=10)), max_size=12)


def test_a_request_loses_hop_by_hop_headers_and_what_connection_names() -> None:
    sent = [
        (b"Host", b"gateway:8080"),
        (b"Connection", b"keep-alive, X-Trace-Hop"),
        (b"X-Trace-Hop", b"1"),
        (b"Expect", b"100-continue"),
        (b"Content-Length", b"1100000"),
        (b"Transfer-Encoding", b"chunked"),
        (b"TE", b"trailers"),
        (b"Keep-Alive", b"timeout=5"),
        (b"Upgrade", b"h2c"),
        (b"X-SIE-Slot", b"pod-1"),
        (b"Authorization", b"Bearer t"),
        (b"Content-Type", b"application/json"),
        (b"X-Request-ID", b"r-1"),
    ]
    assert forward_headers(sent) == (
        ("Authorization", "Bearer t"),
        ("Content-Type", "application/json"),
        ("X-Request-ID", "r-1"),
    )


def test_an_answer_keeps_its_length_unless_the_hop_frames_the_body_itself() -> None:
    answer = [
        ("content-type", "text/event-stream"),
        ("content-length", "12"),
        ("connection", "close, x-engine-hop"),
        ("x-engine-hop", "1"),
        ("date", "Sun, 06 Dec 2026 03:00:00 GMT"),
        ("server", "uvicorn"),
        ("x-sie-slot", "pod-1"),
        ("x-request-id", "r-1"),
    ]
    assert relayed_headers(answer) == [
        ("content-type", "text/event-stream"),
        ("content-length", "12"),
        ("x-request-id", "r-1"),
    ]
    assert ("content-length", "12") not in relayed_headers(answer, keep_length=False)


@given(headers=_HEADERS)
def test_forwarded_headers_are_the_end_to_end_ones_in_their_order(
    headers: list[tuple[str, str]],
) -> None:
    encoded = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]
    named = named_by_connection(v for k, v in headers if k.lower() == "connection")
    own = {"host", "content-length", "expect", "x-sie-slot"}
    expected = tuple(
        (k, v)
        for k, v in headers
        if k.lower() not in HOP_BY_HOP and k.lower() not in own and k.lower() not in named
    )
    assert forward_headers(encoded) == expected


@given(headers=_HEADERS, keep_length=st.booleans())
def test_relayed_headers_never_carry_hop_by_hop_or_server_written_ones(
    headers: list[tuple[str, str]], keep_length: bool
) -> None:
    lowered = [(k.lower(), v) for k, v in headers]
    relayed = relayed_headers(lowered, keep_length=keep_length)
    named = named_by_connection(v for k, v in lowered if k == "connection") - {"content-length"}
    names = {k for k, _ in relayed}
    assert not names & (HOP_BY_HOP | SET_BY_SERVER | named | {"x-sie-slot"})
    assert ("content-length" in names) == (
        keep_length and any(k == "content-length" for k, _ in lowered)
    )
    # Nothing else is dropped, and the order stays.
    assert relayed == [
        (k, v)
        for k, v in lowered
        if k not in HOP_BY_HOP | SET_BY_SERVER | named | {"x-sie-slot"}
        and (keep_length or k != "content-length")
    ]
