"""The floor under bench_answer_cost: what moving a large answer costs any Python process.

Three measures, each the CPU time (user and system, ``getrusage``) of one process per
answer, with nothing else in that process:

- **event loop relay**: a uvloop ``Protocol`` that writes each read to another socket
  (the shape of a hop's relay, before HTTP parsing), ``--bytes`` per answer;
- **splice relay**: the same bytes moved between the sockets by ``splice(2)`` through a
  pipe, never entering the process (``sie_worker.http.zero_copy``);
- **base64 decode**: ``binascii.a2b_base64`` of ``--inputs`` vectors of ``--dims`` float32
  (the part of an SIE encode no relay can skip: the engines send base64).

The sender and the reader of the relays run in a forked child, so the relay's process
holds only the relay.

    .venv/bin/python -m tests.bench.answer_floor [--bytes 1150000] [--answers 300]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import fcntl
import os
import resource
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence

import uvloop

__all__ = ["main"]


def _pair() -> tuple[socket.socket, socket.socket]:
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    listener.close()
    return client, server


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


Relay = Callable[[socket.socket, socket.socket, int], None]


def _relayed(relay: Relay, size: int, n: int) -> float:
    """CPU µs per answer of ``relay`` moving ``n`` answers of ``size`` bytes."""
    source, upstream = _pair()
    downstream, sink = _pair()
    child = os.fork()
    if child == 0:  # the sender and the reader
        upstream.close()
        downstream.close()
        payload = b"x" * size
        sender = threading.Thread(target=lambda: [source.sendall(payload) for _ in range(n)])
        sender.start()
        buffer, got = bytearray(1 << 20), 0
        while got < size * n and (count := sink.recv_into(buffer)):
            got += count
        sender.join()
        os._exit(0)
    source.close()
    sink.close()
    before = _cpu()
    relay(upstream, downstream, size * n)
    spent = _cpu() - before
    os.waitpid(child, 0)
    upstream.close()
    downstream.close()
    return spent * 1e6 / n


def _loop_relay(upstream: socket.socket, downstream: socket.socket, total: int) -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        moved = 0

        class Down(asyncio.Protocol):
            def pause_writing(self) -> None:
                up.pause_reading()

            def resume_writing(self) -> None:
                up.resume_reading()

        class Up(asyncio.Protocol):
            def data_received(self, data: bytes) -> None:
                nonlocal moved
                down.write(data)
                moved += len(data)
                if moved >= total and not done.done():
                    done.set_result(None)

        down, _ = await loop.connect_accepted_socket(Down, downstream)
        up, _ = await loop.connect_accepted_socket(Up, upstream)
        await done
        while down.get_write_buffer_size():  # noqa: ASYNC110 - the transport has no event
            await asyncio.sleep(0.001)

    uvloop.run(run())


def _splice_relay(upstream: socket.socket, downstream: socket.socket, total: int) -> None:
    read, write = os.pipe()
    fcntl.fcntl(write, fcntl.F_SETPIPE_SZ, 1 << 20)
    moved = 0
    while moved < total:
        count = os.splice(upstream.fileno(), write, 1 << 20)
        moved += count
        while count:
            count -= os.splice(read, downstream.fileno(), count)
    os.close(read)
    os.close(write)


def _base64_us(inputs: int, dims: int, rounds: int = 200) -> float:
    vectors = [base64.b64encode(os.urandom(4 * dims)) for _ in range(inputs)]
    before = time.process_time()
    for _ in range(rounds):
        for vector in vectors:
            binascii.a2b_base64(vector, strict_mode=True)
    return (time.process_time() - before) * 1e6 / rounds


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    for option, default in (("bytes", 1_150_000), ("answers", 300), ("inputs", 16), ("dims", 3584)):
        parser.add_argument(f"--{option}", type=int, default=default)
    args = parser.parse_args(argv)
    rows = [
        ("event loop relay", _relayed(_loop_relay, args.bytes, args.answers)),
        ("splice relay", _relayed(_splice_relay, args.bytes, args.answers)),
        (f"base64 decode, {args.inputs} x {args.dims}", _base64_us(args.inputs, args.dims)),
    ]
    print("| measure | CPU µs per answer |\n|---|---:|")
    for name, us in rows:
        print(f"| {name} | {us:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
