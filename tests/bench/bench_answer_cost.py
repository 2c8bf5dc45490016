"""What a large non-streamed answer costs each hop, beside a short completion (issue 51).

Three hops (``sie-worker gateway`` -> ``route`` -> ``serve``) in front of the fake engine,
which serves a generation model and an embedding model of ``--dims`` dimensions. The
request shapes take turns through the gateway, in one run:

- **completion**: a short non-streamed ``/v1/completions`` (4 tokens);
- **openai embedding**: ``/v1/embeddings`` of ``--inputs`` texts, the vectors as JSON floats
  (``encoding_format: float``: 16 x 3,584 is an answer of about 1.1 MB), which the fake engine
  encodes fast (``fake.fast``): a round as long as its JSON encoding would charge each hop
  its background work (polls) for that long;
- **sie encode**: ``/v1/encode/{model}`` of the same texts in MessagePack (what sie-sdk
  sends), which the worker asks of the engine in base64 and answers as float32 bytes.

Each hop's CPU time (``/proc`` of its process) over a shape's requests, divided by them, is
its CPU per request; each shape runs ``--requests`` requests from ``--concurrency`` clients
per round, and the figure is the median round. The ratios to a completion are what the
issue bounds (embedding <= 2x at each hop, SIE encode <= 3x at the worker).

    .venv/bin/python -m tests.bench.bench_answer_cost [--rounds 5] [--requests 200]
        [--concurrency 4] [--dims 3584] [--inputs 16]

Writes ``tests/bench/out/answer_cost.json`` and prints one table; docs/benchmarks.md quotes
it by hand ("One hop, parsed once").
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from tests.bench import bench_gateway as bg
from tests.bench import bench_stream as bs
from tests.bench._bench import (
    MODEL,
    OUT,
    Service,
    cpu_seconds,
    prepare,
    services,
    start_worker,
    write_result,
)
from tests.support import loopback
from tests.support.worker_fixtures import fake_model

__all__ = ["Shape", "main", "shapes"]

EMBEDDER = "org/emb"
_HOPS = ("gateway", "router", "worker")


@dataclass(frozen=True)
class Shape:
    name: str
    path: str
    body: bytes
    content_type: str


def shapes(inputs: int) -> list[Shape]:
    """The request shapes, in the order they take turns."""
    texts = [f"a sentence to embed, number {n}" for n in range(inputs)]
    completion = {"model": MODEL, "prompt": "a b", "max_tokens": 4, "fake": {"fast": True}}
    embedding = {
        "model": EMBEDDER,
        "input": texts,
        "encoding_format": "float",
        "fake": {"fast": True},  # the engine's JSON encoding is not what is measured
    }
    encode = {"items": [{"text": t} for t in texts]}
    return [
        Shape("completion", "/v1/completions", _json(completion), "application/json"),
        Shape("openai embedding", "/v1/embeddings", _json(embedding), "application/json"),
        Shape("sie encode", f"/v1/encode/{EMBEDDER}", msgpack.packb(encode), "application/msgpack"),
    ]


def _json(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()


def _send(url: str, shape: Shape, count: int, concurrency: int) -> list[int]:
    """``count`` requests of ``shape`` from ``concurrency`` clients; the statuses."""
    statuses: list[int] = []
    lock = threading.Lock()
    share = [
        count // concurrency + (1 if i < count % concurrency else 0) for i in range(concurrency)
    ]
    headers = {"content-type": shape.content_type}

    def client(n: int) -> None:
        with loopback.client(base_url=url, timeout=60) as http:
            for _ in range(n):
                status = http.post(shape.path, content=shape.body, headers=headers).status_code
                with lock:
                    statuses.append(status)

    threads = [threading.Thread(target=client, args=(n,)) for n in share]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return statuses


def _round(
    url: str, pids: dict[str, int], shape: Shape, args: argparse.Namespace
) -> dict[str, float]:
    """Each hop's CPU µs per request of one round of ``shape``."""
    before = {hop: cpu_seconds([pid]) for hop, pid in pids.items()}
    statuses = _send(url, shape, args.requests, args.concurrency)
    after = {hop: cpu_seconds([pid]) for hop, pid in pids.items()}
    bad = [s for s in statuses if s != 200]
    if bad:
        raise RuntimeError(f"{shape.name}: {len(bad)} answers were not 200 (first {bad[0]})")
    return {hop: (after[hop] - before[hop]) * 1e6 / len(statuses) for hop in pids}


def _chain(running: list[Service], dims: int) -> tuple[str, dict[str, int]]:
    embedder = fake_model(EMBEDDER, task="encode", env={"FAKE_ENGINE_EMBEDDING_DIM": str(dims)})
    worker = start_worker(
        "answer-cost-worker",
        OUT / "answer-cost-configs",
        models=[fake_model(MODEL), embedder],
        env={"SIE_DEVICES": "cuda:0,cuda:1"},
    )
    running.append(worker)
    for model in (MODEL, EMBEDDER):
        loopback.post(f"{worker.url}/v1/models/{model}/load", timeout=120).raise_for_status()
    router = bs._start_router(worker, None)
    running.append(router)
    gateway = bg._start_gateway(router, None, name="answer-cost-gateway")
    running.append(gateway)
    pids = {"gateway": gateway.proc.pid, "router": router.proc.pid, "worker": worker.proc.pid}
    return gateway.url, pids


def measure(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Per shape, each hop's median CPU µs per request."""
    rounds: dict[str, list[dict[str, float]]] = {}
    with services() as running:
        url, pids = _chain(running, args.dims)
        for shape in shapes(args.inputs):  # warm every path once
            _send(url, shape, 20, args.concurrency)
        for _ in range(args.rounds):
            for shape in shapes(args.inputs):
                rounds.setdefault(shape.name, []).append(_round(url, pids, shape, args))
    return {
        name: {hop: statistics.median(r[hop] for r in tries) for hop in _HOPS}
        for name, tries in rounds.items()
    }


def table(figures: dict[str, dict[str, float]]) -> list[str]:
    """The per-hop table: µs per request of each shape and the ratios to a completion."""
    names = list(figures)
    lines = [
        "| hop | " + " | ".join(f"{n} (µs)" for n in names) + " | "
        + " | ".join(f"{n} / completion" for n in names[1:]) + " |",
        "|---|" + "---:|" * (2 * len(names) - 1),
    ]  # fmt: skip
    for hop in _HOPS:
        cells = [f"{figures[n][hop]:.0f}" for n in names]
        cells += [f"{figures[n][hop] / figures[names[0]][hop]:.1f}x" for n in names[1:]]
        lines.append(f"| {hop} | " + " | ".join(cells) + " |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--dims", type=int, default=3584)
    parser.add_argument("--inputs", type=int, default=16)
    args = parser.parse_args(argv)
    prepare()
    figures = measure(args)
    write_result("answer_cost", {"cpu_us_per_request": figures, "args": vars(args)})
    print("\n".join(table(figures)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
