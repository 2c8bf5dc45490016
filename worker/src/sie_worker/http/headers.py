"""Which headers a hop passes on, both ways: one rule for every relay (router, gateway).

A hop is an HTTP/1.1 intermediary, so it drops the hop-by-hop headers of RFC 9110 (7.6.1):
``Connection`` and every header it names, ``Proxy-Connection``, ``Keep-Alive``, ``TE``,
``Transfer-Encoding``, ``Upgrade`` (and ``Trailer``, ``Proxy-Authenticate``,
``Proxy-Authorization``, RFC 7230's list), plus what the hop writes itself: ``Host`` and
``Content-Length`` of a request (the client of each hop frames its own), ``Date`` and
``Server`` of an answer (its server writes them). A request's ``Expect`` is dropped too: the hop
the client talks to answers ``100 Continue`` itself (uvicorn does, on the app's first read
of the body), and the next hop gets the whole body at once. ``X-SIE-Slot`` is the router's
own (which slot a request was pinned to), never passed on.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "HOP_BY_HOP",
    "MAX_HEAD_BYTES",
    "SET_BY_SERVER",
    "SPLICE_FROM",
    "body_length",
    "forward_headers",
    "named_by_connection",
    "relayed_headers",
]

# The largest head (request or status line, and headers) a hop takes, from a client (431)
# or from its backend (502).
MAX_HEAD_BYTES = 64 * 1024
HOP_BY_HOP = frozenset(
    {
        "connection",
        "proxy-connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
# The router's own header: which slot a request went to (a request's, or the answer's).
_ROUTER_OWN = "x-sie-slot"
# What each hop writes of a request itself, and the requests it answers itself.
_REQUEST_OWN = frozenset({"host", "content-length", "expect", _ROUTER_OWN})
# Response headers the relaying server writes itself: relaying the backend's would repeat them.
SET_BY_SERVER = frozenset({"date", "server"})
_ANSWER_DROPPED = HOP_BY_HOP | SET_BY_SERVER | {_ROUTER_OWN}


# A body with a length from this size on is relayed in the kernel (sie_worker.http.zero_copy):
# below it, copying costs less than the pipe and the extra system calls.
SPLICE_FROM = 64 * 1024


def body_length(headers: Iterable[tuple[str, str]]) -> int | None:
    """The body's length when ``Content-Length`` frames it (no transfer coding), from
    headers with lower-case names."""
    length: int | None = None
    for name, value in headers:
        if name == "transfer-encoding":
            return None
        if name == "content-length":
            if not value.isdigit() or length is not None:
                return None
            length = int(value)
    return length


def named_by_connection(values: Iterable[str]) -> frozenset[str]:
    """The header names ``Connection`` lists (its values, comma-separated), lower-cased."""
    return frozenset(
        token.strip().lower() for value in values for token in value.split(",") if token.strip()
    )


def forward_headers(headers: Iterable[tuple[bytes, bytes]]) -> tuple[tuple[str, str], ...]:
    """A client's request headers as a hop sends them to the next: the hop-by-hop ones,
    those ``Connection`` names, and what the hop writes or answers itself, left out."""
    decoded = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers]
    named = named_by_connection(v for k, v in decoded if k.lower() == "connection")
    return tuple(
        (k, v)
        for k, v in decoded
        if (lower := k.lower()) not in HOP_BY_HOP
        and lower not in _REQUEST_OWN
        and lower not in named
    )


def relayed_headers(
    headers: Iterable[tuple[str, str]], *, keep_length: bool = True
) -> list[tuple[str, str]]:
    """A backend's answer headers (lower-case names) as the hop relays them to its client:
    hop-by-hop ones, those ``Connection`` names, ``Date``, ``Server`` and the router's own
    left out; ``Content-Length`` kept when ``keep_length`` (a relayed body keeps its framing;
    a body the hop answers whole gets its server's)."""
    pairs = list(headers)
    named = named_by_connection(v for k, v in pairs if k == "connection") - {"content-length"}
    return [
        (k, v)
        for k, v in pairs
        if k not in _ANSWER_DROPPED and k not in named and (keep_length or k != "content-length")
    ]
