"""SSE load generator: C concurrent streams against one OpenAI completions URL, for a while.

Runs in its own process (the runner pins it to a core with ``taskset``) on uvloop with raw
asyncio protocols, so that the client is not what limits a measurement: per received
segment it only timestamps, undoes the chunked framing (proxies re-chunk, so an event can
straddle chunks) and counts event boundaries (``\\n\\n``) with ``bytes.count``.

Each of ``--concurrency`` clients (starting at random moments of the warm-up, so that
requests do not arrive in bursts) opens a connection, sends one streaming
``POST /v1/completions`` (``"fake": {"tokens": N, ...}`` tells the fake engine how fast to
stream), reads until the ``[DONE]`` event, closes, and starts over until the run ends.
Only what happens inside the measurement window (after ``--warmup``) is counted:

- ``events``: SSE events received (each stream is N token events, a finish event, [DONE]);
- ``ttft``: request sent -> first event, for first events inside the window;
- ``itl``: gaps between consecutive events of a stream. Events that arrive in one segment
  share a timestamp, so part of the gaps are 0 (reported as ``itl_zero_share``).

Prints ``# window start`` and ``# window end`` as the window opens and closes (the runner
samples the servers' CPU time then), then one JSON object. Usage::

    python tests/bench/loadgen.py --url http://127.0.0.1:8080/v1/completions \\
        --model bench/fake --concurrency 64 --duration 5 --tokens 2000 --fast
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import urlsplit

__all__ = ["main"]

_HEAD_END = b"\r\n\r\n"
_DONE = b"data: [DONE]"


@dataclass
class _Totals:
    """What every stream adds to, inside the measurement window."""

    window_start: float
    window_end: float
    events: int = 0
    events_all: int = 0  # warm-up and tail included: what the servers relayed in all
    streams_done: int = 0
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    ttft: array[float] = field(default_factory=lambda: array("d"))
    itl: array[float] = field(default_factory=lambda: array("d"))  # gaps > 0
    itl_zero: int = 0  # gaps of 0: events that arrived in the same segment as the previous

    def error(self, text: str) -> None:
        self.errors += 1
        if len(self.error_samples) < 5:
            self.error_samples.append(text)


class _Stream(asyncio.Protocol):
    """One request/response on one connection; ``done`` resolves when it is over."""

    def __init__(self, request: bytes, totals: _Totals, done: asyncio.Future[None]) -> None:
        self.request = request
        self.totals = totals
        self.done = done
        self.transport: asyncio.Transport | None = None
        self.sent = 0.0
        self.head = b""
        self.in_body = False
        self.last = -1.0  # arrival time of the previous event
        self.tail = b""  # last payload bytes seen, to find a boundary split across segments
        self.chunked = False
        self.raw = b""  # chunked framing not parsed yet
        self.remaining = 0  # payload bytes left in the current chunk
        self.crlf = False  # the current chunk's trailing CRLF is still to come

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.sent = time.perf_counter()
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        if not self.in_body:
            self.head += data
            end = self.head.find(_HEAD_END)
            if end < 0:
                return
            status = self.head[: self.head.find(b"\r\n")]
            if b" 200 " not in status + b" ":
                self._finish(f"{status.decode('latin-1')}: {self.head[end + 4 :][:200]!r}")
                return
            self.in_body = True
            self.chunked = b"transfer-encoding: chunked" in self.head[:end].lower()
            data = self.head[end + 4 :]
            self.head = b""
            if not data:
                return
        if self.chunked:
            data = self._dechunk(data)
        joined = self.tail + data
        count = joined.count(b"\n\n") - self.tail.count(b"\n\n")
        self.tail = joined[-16:]
        if count:
            self._events(now, count)
        if _DONE in joined:
            self._finish(None)

    def _dechunk(self, data: bytes) -> bytes:
        """The payload in ``data`` (chunked transfer coding; proxies re-chunk at will)."""
        buf = self.raw + data if self.raw else data
        out = []
        pos, size = 0, len(buf)
        while pos < size:
            if self.remaining:
                piece = buf[pos : pos + self.remaining]
                out.append(piece)
                pos += len(piece)
                self.remaining -= len(piece)
                if self.remaining:
                    break
                self.crlf = True
            if self.crlf:
                if size - pos < 2:
                    break
                pos += 2
                self.crlf = False
            end = buf.find(b"\r\n", pos)
            if end < 0:
                break
            self.remaining = int(buf[pos:end].split(b";", 1)[0], 16)
            pos = end + 2
            if not self.remaining:  # the last chunk
                pos = size
                break
        self.raw = buf[pos:]
        return out[0] if len(out) == 1 else b"".join(out)

    def _events(self, now: float, count: int) -> None:
        totals = self.totals
        totals.events_all += count
        inside = totals.window_start <= now <= totals.window_end
        if self.last < 0:
            if inside:
                totals.ttft.append(now - self.sent)
        elif inside:
            totals.itl.append(now - self.last)
        if inside:
            totals.events += count
            totals.itl_zero += count - 1
        self.last = now

    def _finish(self, error: str | None) -> None:
        if self.done.done():
            return
        now = time.perf_counter()
        if error is not None:
            self.totals.error(error)
        elif self.totals.window_start <= now <= self.totals.window_end:
            self.totals.streams_done += 1
        if self.transport is not None:
            self.transport.close()
        self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self._finish(f"connection closed before [DONE]: {exc!r}")


def _request(url: str, model: str, tokens: int, fast: bool, token_delay_s: float) -> bytes:
    parts = urlsplit(url)
    fake: dict[str, Any] = {"tokens": tokens}
    if fast:
        fake["fast"] = True
    else:
        fake["token_delay_s"] = token_delay_s
    body = json.dumps(
        {"model": model, "prompt": "the quick brown fox", "stream": True, "fake": fake}
    ).encode()
    head = (
        f"POST {parts.path or '/'} HTTP/1.1\r\n"
        f"Host: {parts.netloc}\r\n"
        "Content-Type: application/json\r\n"
        "Accept: text/event-stream\r\n"
        f"Content-Length: {len(body)}\r\n"
        "\r\n"
    )
    return head.encode() + body


async def _client(
    host: str, port: int, request: bytes, totals: _Totals, stop_at: float, delay_s: float
) -> None:
    loop = asyncio.get_running_loop()
    await asyncio.sleep(delay_s)
    while time.perf_counter() < stop_at:
        done: asyncio.Future[None] = loop.create_future()
        try:
            transport, _ = await loop.create_connection(
                lambda done=done: _Stream(request, totals, done),  # type: ignore[misc]
                host,
                port,
            )
        except OSError as exc:
            totals.error(f"connect: {exc}")
            await asyncio.sleep(0.05)
            continue
        try:
            await asyncio.wait_for(done, timeout=max(stop_at - time.perf_counter(), 0.001))
        except TimeoutError:
            transport.close()  # the run is over: abandon the stream


def _mark(what: str) -> None:
    """Tell the runner (reading our stdout) where the window is, to sample server CPU."""
    sys.stdout.write(f"# {what}\n")
    sys.stdout.flush()


def _percentile(sorted_values: Sequence[float], zeros: int, q: float) -> float | None:
    n = len(sorted_values) + zeros
    if n == 0:
        return None
    rank = max(0, math.ceil(q * n) - 1)
    return 0.0 if rank < zeros else sorted_values[rank - zeros]


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    parts = urlsplit(args.url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    request = _request(args.url, args.model, args.tokens, args.fast, args.token_delay_s)
    start = time.perf_counter()
    totals = _Totals(start + args.warmup, start + args.warmup + args.duration)
    # Clients start at spread-out moments of the warm-up (fixed seed), so that requests do
    # not keep arriving in bursts of --concurrency at once (streams all have one length).
    rnd = random.Random(args.concurrency)
    clients = [
        asyncio.ensure_future(
            _client(host, port, request, totals, totals.window_end, rnd.uniform(0, args.warmup))
        )
        for _ in range(args.concurrency)
    ]
    await asyncio.sleep(max(totals.window_start - time.perf_counter(), 0.0))
    cpu_window = time.process_time()
    _mark("window start")
    await asyncio.sleep(max(totals.window_end - time.perf_counter(), 0.0))
    cpu_used = time.process_time() - cpu_window
    _mark("window end")
    await asyncio.gather(*clients)
    ttft = sorted(totals.ttft)
    itl = sorted(totals.itl)
    return {
        "concurrency": args.concurrency,
        "tokens_per_stream": args.tokens,
        "fast": args.fast,
        "token_delay_s": None if args.fast else args.token_delay_s,
        "window_s": args.duration,
        "events": totals.events,
        "events_per_s": totals.events / args.duration,
        "events_all": totals.events_all,
        "streams_done": totals.streams_done,
        "errors": totals.errors,
        "error_samples": totals.error_samples,
        "ttft_p50_s": _percentile(ttft, 0, 0.50),
        "ttft_p99_s": _percentile(ttft, 0, 0.99),
        "itl_p50_s": _percentile(itl, totals.itl_zero, 0.50),
        "itl_p99_s": _percentile(itl, totals.itl_zero, 0.99),
        "itl_samples": len(itl) + totals.itl_zero,
        "itl_zero_share": totals.itl_zero / max(len(itl) + totals.itl_zero, 1),
        "client_cpu_share": cpu_used / args.duration,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--url", required=True, help="http://host:port/v1/completions")
    parser.add_argument("--model", required=True)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--duration", type=float, default=5.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds first")
    parser.add_argument("--tokens", type=int, default=1000, help="token events per stream")
    parser.add_argument("--fast", action="store_true", help="engine streams as fast as it can")
    parser.add_argument(
        "--token-delay-s", type=float, default=0.02, help="engine's gap between events"
    )
    args = parser.parse_args(argv)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is in the venv
        result = asyncio.run(_run(args))
    else:
        result = uvloop.run(_run(args))
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
