"""SIE encode in MessagePack vs OpenAI embeddings in JSON: 32 items per request, same model.

One worker per engine, three request shapes taking turns on it in one run:

- **sie msgpack**: ``POST /v1/encode/{model}``, a MessagePack body, the answer in
  MessagePack with each vector as raw float32 bytes (what sie-sdk sends and reads);
- **openai json**: ``POST /v1/embeddings`` with float lists (``encoding_format: float``);
- **openai base64**: the same with ``encoding_format: base64`` (the openai client's default).

Each client decodes what it gets into float32 arrays (MessagePack: the raw bytes; JSON: the
numbers; base64: decode then the bytes), as the clients do. Engines: the fake SGLang engine
(384-dimensional vectors, so the worker's translation and the wire are all there is to
measure) and all-MiniLM-L6-v2 on the default engine on CPU (a real model; inference then
dominates). Each round runs every shape for ``--seconds``; the figures are the median
round. Requests/s, bytes per request each way, and latency p50 are reported.

Writes ``tests/bench/out/sie_encode.json`` and the ``## SIE encode: MessagePack vs JSON``
section of ``docs/benchmarks.md`` (replaced, or added at the end), unless ``--no-record``.

    .venv/bin/python -m tests.bench.bench_sie_encode [--rounds 5] [--seconds 3] [--no-record]
"""

from __future__ import annotations

import argparse
import array
import asyncio
import base64
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import msgpack

from tests.bench._bench import OUT, ROOT, prepare, services, start_worker, summary, write_result
from tests.bench.report import record_section
from tests.support import loopback
from tests.support.default_worker import minilm_config
from tests.support.tiny_models import minilm_model_dir
from tests.support.worker_fixtures import fake_model

__all__ = ["main"]

ITEMS = 32
SECTION = "## SIE encode: MessagePack vs JSON"
_TEXT = "embeddings map sentences to vectors and similar sentences land close together {n}"
_SHAPES = ("sie msgpack", "openai json", "openai base64")


@dataclass(frozen=True)
class Shape:
    name: str
    path: str
    body: bytes
    headers: dict[str, str]
    decode: Callable[[bytes], list[array.array[float]]]


def _shapes(model: str) -> list[Shape]:
    texts = [_TEXT.format(n=n) for n in range(ITEMS)]
    sie = {"items": [{"id": str(n), "text": t} for n, t in enumerate(texts)]}
    openai = {"model": model, "input": texts}

    def from_msgpack(content: bytes) -> list[array.array[float]]:
        items = msgpack.unpackb(content, raw=False)["items"]
        return [array.array("f", item["dense"]["values"][b"data"]) for item in items]

    def from_json(content: bytes) -> list[array.array[float]]:
        return [array.array("f", d["embedding"]) for d in json.loads(content)["data"]]

    def from_base64(content: bytes) -> list[array.array[float]]:
        data = json.loads(content)["data"]
        return [array.array("f", base64.b64decode(d["embedding"])) for d in data]

    as_json = {"content-type": "application/json"}
    return [
        Shape(
            "sie msgpack",
            f"/v1/encode/{model}",
            msgpack.packb(sie),
            {"content-type": "application/msgpack", "accept": "application/msgpack"},
            from_msgpack,
        ),
        Shape("openai json", "/v1/embeddings", json.dumps(openai).encode(), as_json, from_json),
        Shape(
            "openai base64",
            "/v1/embeddings",
            json.dumps({**openai, "encoding_format": "base64"}).encode(),
            as_json,
            from_base64,
        ),
    ]


async def _window(url: str, shape: Shape, clients: int, seconds: float) -> dict[str, Any]:
    latencies: list[float] = []
    sizes: list[int] = []
    errors = 0
    deadline = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:

        async def one_client() -> None:
            nonlocal errors
            while time.monotonic() < deadline:
                started = time.monotonic()
                response = await client.post(shape.path, content=shape.body, headers=shape.headers)
                if response.status_code != 200:
                    errors += 1
                    continue
                vectors = shape.decode(response.content)
                assert len(vectors) == ITEMS
                latencies.append(time.monotonic() - started)
                sizes.append(len(response.content))

        began = time.monotonic()
        await asyncio.gather(*(one_client() for _ in range(clients)))
        elapsed = time.monotonic() - began
    return {
        "requests_per_s": len(latencies) / elapsed,
        "requests": len(latencies),
        "errors": errors,
        "request_bytes": len(shape.body),
        "response_bytes": statistics.median(sizes) if sizes else None,
        "latency_ms": {
            k: v * 1000 if isinstance(v, float) else v for k, v in summary(latencies).items()
        },
    }


def _same_vectors(url: str, shapes: Sequence[Shape]) -> float:
    """The largest difference between the shapes' vectors (they must agree)."""
    answers = []
    with loopback.client(base_url=url, timeout=300) as client:
        for shape in shapes:
            response = client.post(shape.path, content=shape.body, headers=shape.headers)
            response.raise_for_status()
            answers.append(shape.decode(response.content))
    return max(
        abs(a - b)
        for other in answers[1:]
        for va, vb in zip(answers[0], other, strict=True)
        for a, b in zip(va, vb, strict=True)
    )


def _measure(url: str, model: str, *, rounds: int, seconds: float, clients: int) -> dict[str, Any]:
    shapes = _shapes(model)
    difference = _same_vectors(url, shapes)
    asyncio.run(_window(url, shapes[0], clients, min(seconds, 1.0)))  # warm-up
    per_round: dict[str, list[dict[str, Any]]] = {s.name: [] for s in shapes}
    for _ in range(rounds):
        for shape in shapes:
            per_round[shape.name].append(asyncio.run(_window(url, shape, clients, seconds)))
    cells = {}
    for name, runs in per_round.items():
        ordered = sorted(runs, key=lambda r: r["requests_per_s"])
        cells[name] = {**ordered[len(ordered) // 2], "rounds": [r["requests_per_s"] for r in runs]}
    return {"clients": clients, "max_vector_difference": difference, "cells": cells}


def _section(result: dict[str, Any], command: str) -> str:
    lines = [
        SECTION,
        "",
        f"What it measures: SIE's native encode (`POST /v1/encode/{{model}}`, MessagePack both "
        f"ways, what sie-sdk sends) against OpenAI's `POST /v1/embeddings` in JSON, {ITEMS} "
        "texts per request, the same model on the same worker; each client decodes the "
        "answer into float32 arrays. Shapes take turns within each round; figures are the "
        "median round. `tests/bench/bench_sie_encode.py` (its docstring has the details).",
        "",
        f"Command: `{command}` (`tests/bench/run` runs it too), {result['started']}; "
        f"{result['rounds']} rounds of "
        f"{result['seconds']:g} s per shape.",
        "",
    ]
    for engine, data in result["engines"].items():
        cells = data["cells"]
        base = cells["openai json"]
        lines += [
            f"**{engine}** ({data['clients']} concurrent clients; the three shapes' vectors "
            f"differ by at most {data['max_vector_difference']:.1e}):",
            "",
            "| shape | requests/s | vs openai json | request bytes | response bytes | "
            "vs openai json | latency p50 (ms) | errors |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for name in _SHAPES:
            cell = cells[name]
            lines.append(
                f"| {name} | {cell['requests_per_s']:,.1f} | "
                f"{cell['requests_per_s'] / base['requests_per_s']:.2f}x | "
                f"{cell['request_bytes']:,} | {cell['response_bytes']:,.0f} | "
                f"{cell['response_bytes'] / base['response_bytes']:.2f}x | "
                f"{cell['latency_ms']['p50']:.1f} | {cell['errors']} |"
            )
        lines.append("")
    fake, real = (data["cells"] for data in result["engines"].values())
    sie, plain, b64 = (fake[name] for name in _SHAPES)
    real_ratio = real["sie msgpack"]["requests_per_s"] / real["openai json"]["requests_per_s"]
    lines += [
        "Reading: an answer in MessagePack carries each vector as its raw float32 bytes, "
        f"{sie['response_bytes'] / plain['response_bytes']:.0%} of the JSON answer's bytes "
        f"and {sie['response_bytes'] / b64['response_bytes']:.0%} of the base64 one's. The "
        "worker asks the engine for base64 and turns it into those bytes without converting "
        "a number, so with the fake engine (where the worker, the engine's serialisation and "
        "the wire are all there is) MessagePack runs at "
        f"{sie['requests_per_s'] / plain['requests_per_s']:.1f}x the requests/s of float JSON "
        f"(most of that gap is printing and parsing {ITEMS} x 384 numbers as text) and "
        f"{sie['requests_per_s'] / b64['requests_per_s']:.2f}x base64's. With MiniLM on CPU "
        "inference takes most of each request, the same for every shape; MessagePack then "
        f"runs at {real_ratio:.2f}x float JSON.",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients, fake engine")
    parser.add_argument("--model-clients", type=int, default=2, help="concurrent clients, MiniLM")
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "benchmarks.md")
    parser.add_argument("--no-record", action="store_true", help="print, do not write the doc")
    args = parser.parse_args(argv)
    prepare()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    engines: dict[str, Any] = {}
    fake = fake_model("bench/emb", task="encode", env={"FAKE_ENGINE_EMBEDDING_DIM": "384"})
    minilm = minilm_config(minilm_model_dir())
    minilm["profiles"]["default"]["adapter_options"] = {"loadtime": {"threads": 1}}
    default_env = {
        "SIE_BUNDLE": "default",
        "SIE_DEVICES": "cpu",
        "SIE_MODEL_READY_TIMEOUT_S": "240",
    }
    runs = [
        ("fake SGLang engine, 384 dimensions", "bench/emb", [fake], {}, args.clients),
        ("all-MiniLM-L6-v2, default engine on CPU", minilm["sie_id"], [minilm], default_env,
         args.model_clients),
    ]  # fmt: skip
    for label, model, models, env, clients in runs:
        with services() as running:
            worker = start_worker(
                f"sie-encode-{len(engines)}", OUT / f"sie-encode-configs-{len(engines)}",
                models=models, env=env,
            )  # fmt: skip
            running.append(worker)
            loopback.post(f"{worker.url}/v1/models/{model}/load", timeout=300).raise_for_status()
            print(f"\n### {label}", flush=True)
            data = _measure(
                worker.url, model, rounds=args.rounds, seconds=args.seconds, clients=clients
            )
            for name, cell in data["cells"].items():
                print(
                    f"{name:14} {cell['requests_per_s']:9.1f} req/s  "
                    f"{cell['request_bytes']:8,} B up  {cell['response_bytes']:9,.0f} B down  "
                    f"p50 {cell['latency_ms']['p50']:7.1f} ms  errors {cell['errors']}",
                    flush=True,
                )
            engines[label] = data
    result = {
        "started": started,
        "rounds": args.rounds,
        "seconds": args.seconds,
        "engines": engines,
    }
    write_result("sie_encode", result)
    args_given = list(sys.argv[1:] if argv is None else argv)
    command = " ".join([".venv/bin/python -m tests.bench.bench_sie_encode", *args_given])
    section = _section(result, command)
    if args.no_record:
        print("\n" + section)
    else:
        record_section(args.output, section)
        print(f"\nwrote the '{SECTION[3:]}' section of {args.output}")
    failed = any(c["errors"] for d in engines.values() for c in d["cells"].values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
