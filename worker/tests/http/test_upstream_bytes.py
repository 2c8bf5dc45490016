"""The upstream answer parser at the byte level: any interim heads, then a final head, then a
body framed by Content-Length or by chunks, fed in any split; truncated and malformed heads
and chunk framing end in an error, never in a wrong answer."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import httpx
from hypothesis import given, settings
from hypothesis import strategies as st

from sie_worker.http.deadlines import Deadlines
from sie_worker.http.upstream_answer import UpstreamAnswer

_TOKEN = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=12).filter(
    lambda s: s[0] != "-" and s not in ("content-length", "transfer-encoding", "connection")
)
_VALUE = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789 /;=.,", max_size=24).map(str.strip)
_HEADERS = st.lists(st.tuples(_TOKEN, _VALUE), max_size=4)


class _Transport:
    """What UpstreamAnswer needs of a transport, recording what it is told."""

    def __init__(self) -> None:
        self.closed = self.aborted = False

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...
    def write(self, data: bytes) -> None: ...

    def get_write_buffer_size(self) -> int:
        return 0

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True


def _head(status: int, headers: list[tuple[str, str]]) -> bytes:
    lines = [f"HTTP/1.1 {status} X"] + [f"{k}: {v}" for k, v in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _chunked(body: bytes, sizes: list[int]) -> bytes:
    out, rest = [], body
    for size in sizes:
        if not rest:
            break
        part, rest = rest[:size], rest[size:]
        out.append(b"%x\r\n%s\r\n" % (len(part), part))
    if rest:
        out.append(b"%x\r\n%s\r\n" % (len(rest), rest))
    return b"".join(out) + b"0\r\n\r\n"


def _splits(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points) if b > a]


def _parse(pieces: list[bytes], *, lost: bool) -> UpstreamAnswer:
    async def run() -> UpstreamAnswer:
        response = UpstreamAnswer(Deadlines(None), 1 << 30, lambda chunk, previous: False)
        response.connection_made(_Transport())  # type: ignore[arg-type]
        for piece in pieces:
            response.data_received(piece)
        if lost:
            response.connection_lost(None)
        return response

    return asyncio.run(run())


def _body(response: UpstreamAnswer) -> bytes:
    return response.rest()


_INTERIM = st.lists(
    st.tuples(st.integers(100, 199).filter(lambda s: s != 101), _HEADERS), max_size=3
)


# 204 and 304 answers have no body whatever their framing says (RFC 9112, 6.3): not ones
# that carry the body drawn here.
_WITH_BODY = st.integers(200, 599).filter(lambda s: s not in (204, 304))


@settings(max_examples=300)
@given(
    interim=_INTERIM,
    status=_WITH_BODY,
    headers=_HEADERS,
    body=st.binary(max_size=300),
    chunked=st.booleans(),
    sizes=st.lists(st.integers(1, 64), max_size=8),
    cuts=st.lists(st.integers(0, 10_000), max_size=12),
)
def test_any_interim_heads_then_the_final_answer_in_any_split_parse_to_that_answer(
    interim: list[tuple[int, list[tuple[str, str]]]],
    status: int,
    headers: list[tuple[str, str]],
    body: bytes,
    chunked: bool,
    sizes: list[int],
    cuts: list[int],
) -> None:
    framing = ("transfer-encoding", "chunked") if chunked else ("content-length", str(len(body)))
    data = b"".join(_head(s, h) for s, h in interim)
    data += _head(status, [*headers, framing])
    data += _chunked(body, sizes) if chunked else body
    response = _parse(_splits(data, cuts), lost=False)
    assert response.error is None
    assert response.finished
    assert response.status == status
    assert response.headers == [*headers, framing]
    assert _body(response) == body


@settings(max_examples=200)
@given(
    status=_WITH_BODY,
    body=st.binary(min_size=1, max_size=200),
    chunked=st.booleans(),
    sizes=st.lists(st.integers(1, 64), max_size=6),
    cut=st.integers(1, 10_000),
    splits=st.lists(st.integers(0, 10_000), max_size=6),
)
def test_an_answer_cut_short_before_its_framing_ends_is_an_error(
    status: int, body: bytes, chunked: bool, sizes: list[int], cut: int, splits: list[int]
) -> None:
    framing = ("transfer-encoding", "chunked") if chunked else ("content-length", str(len(body)))
    whole = _head(status, [framing]) + (_chunked(body, sizes) if chunked else body)
    data = whole[: cut % len(whole)]  # never the whole answer
    response = _parse(_splits(data, splits), lost=True)
    assert isinstance(response.error, httpx.RemoteProtocolError | httpx.ReadError)
    assert response.finished


@given(
    garbage=st.sampled_from(
        [
            b"zz\r\nab\r\n0\r\n\r\n",  # a chunk size that is no hex number
            b"3\r\nabcXY0\r\n\r\n",  # a chunk longer than its size
            b"-1\r\n\r\n",
            b"3\r\nabc\r\n0\r\nbad trailer\r\n\r\n",
        ]
    ),
    cuts=st.lists(st.integers(0, 100), max_size=4),
)
def test_malformed_chunk_framing_is_a_protocol_error(garbage: bytes, cuts: list[int]) -> None:
    data = _head(200, [("transfer-encoding", "chunked")]) + garbage
    response = _parse(_splits(data, cuts), lost=True)
    assert isinstance(response.error, httpx.RemoteProtocolError)


@given(
    head=st.sampled_from(
        [
            b"HTTP/1.1 2x0 OK\r\n\r\n",
            b"NOT HTTP\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nbad header line\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n",
        ]
    )
)
def test_a_malformed_head_is_a_protocol_error(head: bytes) -> None:
    response = _parse([head], lost=True)
    assert isinstance(response.error, httpx.RemoteProtocolError)


def test_a_head_over_64_kib_is_refused_whole_or_in_pieces() -> None:
    big = _head(200, [("x-big", "a" * (65 * 1024)), ("content-length", "0")])
    for pieces in ([big], [big[i : i + 1000] for i in range(0, len(big), 1000)]):
        response = _parse(pieces, lost=False)
        assert isinstance(response.error, httpx.RemoteProtocolError)
        assert "64 KiB" in str(response.error)


def test_interim_heads_count_toward_nothing_of_the_final_answer() -> None:
    data = _head(100, [("x-interim", "1")]) + _head(204, [("content-length", "0")])
    response = _parse([data], lost=False)
    assert (response.status, response.headers) == (204, [("content-length", "0")])
    kept: Any = response._keep_alive
    assert kept is True
