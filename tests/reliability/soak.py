"""Soak: minutes of mixed load with evictions against one worker, then leaks are looked for.

Not part of the test command (it takes 10 minutes). Run from the repository root::

    .venv/bin/python tests/reliability/soak.py                  # 10 min, writes the figures
    .venv/bin/python tests/reliability/soak.py --minutes 1 --no-record   # a quick look

One ``sie-worker serve`` owns 2 devices and 6 models (four of width 1, one of them an
embedding model, two of width 2), served by fake SGLang engines that take 0.2-0.6 s to
start, so the load keeps evicting. Client threads send a mix: streamed and plain
completions and chats, embeddings, ``Prefer: wait=0`` requests, explicit loads and unloads,
Config API writes, and now and then a fault (an engine that dies mid-stream, a broken event
stream). Clients honour ``Retry-After``.

After a warm-up (imports, pools and caches reach their steady size) the worker's resident
memory, open file descriptors, threads and processes are measured with every model
unloaded; again after the load stops, unloaded the same way. It fails (exit 1) when RSS
grew by more than 10%, when file descriptors grew by more than 32, when an engine process
outlived its model, or when any answer was not a 200 or a DESIGN.md error. The figures go
to the ``## Soak`` section of ``docs/benchmarks.md`` (replaced, or added at the end; no
other section is touched).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import random
import shlex
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from sie_worker.errors import InvalidRequest  # noqa: E402

from tests.bench.report import record_section  # noqa: E402
from tests.reliability._support import (  # noqa: E402 - after the path is set
    LOAD_ERRORS,
    Launcher,
    Worker,
    assert_clean,
    error_statuses,
)
from tests.support import loopback  # noqa: E402
from tests.support.engine_fixtures import FAKE_ENGINE_SCRIPT  # noqa: E402
from tests.support.worker_fixtures import fake_model  # noqa: E402

_MODELS = {  # id -> (width, task, start delay)
    "soak/g1": (1, "generate", "0.2"),
    "soak/g2": (1, "generate", "0.3"),
    "soak/g3": (1, "generate", "0.4"),
    "soak/e1": (1, "encode", "0.2"),
    "soak/tp-a": (2, "generate", "0.6"),
    "soak/tp-b": (2, "generate", "0.5"),
}
_CODES = error_statuses(InvalidRequest, *LOAD_ERRORS)
_RSS_GROWTH_LIMIT = 0.10
_FD_GROWTH_LIMIT = 32
_SECTION = "## Soak"


@dataclass
class Sample:
    rss_mib: float
    fds: int
    threads: int
    processes: int  # the worker's descendants: engines and their ranks
    connections: int

    @classmethod
    def of(cls, worker: Worker) -> Sample:
        process = psutil.Process(worker.process.pid)
        with process.oneshot():
            return cls(
                rss_mib=process.memory_info().rss / 2**20,
                fds=process.num_fds(),
                threads=process.num_threads(),
                processes=len(process.children(recursive=True)),
                connections=len(process.net_connections(kind="tcp")),
            )


@dataclass
class Tally:
    lock: threading.Lock = field(default_factory=threading.Lock)
    answers: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    examples: dict[str, str] = field(default_factory=dict)  # one message per error code

    def add(self, key: str, problem: str | None = None) -> None:
        with self.lock:
            self.answers[key] += 1
            if problem is not None and len(self.problems) < 50:
                self.problems.append(problem)


def _request(rng: random.Random) -> tuple[str, str, dict[str, Any] | None, dict[str, str]]:
    model = rng.choice(list(_MODELS))
    task = _MODELS[model][1]
    headers = {"Prefer": "wait=0"} if rng.random() < 0.05 else {}
    roll = rng.random()
    if roll < 0.02:
        return "POST", f"/v1/models/{model}/{rng.choice(['load', 'unload'])}", None, {}
    if task == "encode":
        return "POST", "/v1/embeddings", {"model": model, "input": ["a", "b"]}, headers
    body: dict[str, Any] = {"model": model, "max_tokens": rng.randint(1, 24)}
    body["stream"] = rng.random() < 0.5
    if roll < 0.025:
        body.update(stream=True, fake={"die_after": 2})  # the engine crashes mid-stream
    elif roll < 0.03:
        body.update(stream=True, fake={"malformed": "sse"})
    if rng.random() < 0.5:
        body["messages"] = [{"role": "user", "content": "soak test prompt"}]
        return "POST", "/v1/chat/completions", body, headers
    body["prompt"] = "soak test prompt"
    return "POST", "/v1/completions", body, headers


def _judge(response: httpx.Response, payload: bytes, tally: Tally) -> float:
    """Record the answer; return the seconds to wait before the next request."""
    if response.status_code == 200:
        tally.add("200")
        return 0.0
    try:
        error = httpx.Response(response.status_code, content=payload).json()["error"]
        code = str(error["code"])
    except (ValueError, KeyError, TypeError):
        tally.add(f"{response.status_code} ?", f"{response.status_code}: {payload[:200]!r}")
        return 0.5
    expected = _CODES.get(code)
    problem = (
        f"{response.request.method} {response.request.url.path}: {response.status_code} {error}"
    )
    tally.add(code, None if expected == response.status_code else problem)
    tally.examples.setdefault(code, str(error.get("message", ""))[:300])
    retry = response.headers.get("retry-after", "")
    return min(float(retry), 2.0) if retry.isdigit() else 0.2


def _client(worker: Worker, seed: int, stop: threading.Event, tally: Tally) -> None:
    rng = random.Random(seed)
    # Keep-alive shorter than the server's 5 s, as clients should (see the issue note).
    limits = httpx.Limits(keepalive_expiry=2.0)
    with loopback.client(base_url=worker.url, timeout=120, limits=limits) as client:
        while not stop.is_set():
            method, path, body, headers = _request(rng)
            try:
                with client.stream(method, path, json=body, headers=headers) as response:
                    payload = response.read()
            except httpx.HTTPError as exc:
                tally.add("transport error", f"{path}: {exc!r}")
                time.sleep(0.5)
                continue
            wait = _judge(response, payload, tally)
            time.sleep(wait * rng.uniform(0.5, 1.0) + rng.uniform(0.0, 0.05))


def _config_writer(worker: Worker, stop: threading.Event, tally: Tally) -> None:
    version = 0
    with loopback.client(base_url=worker.url, timeout=60) as client:
        while not stop.wait(3.0):
            version += 1
            config = fake_model(
                "soak/cfg", env={"VERSION": str(version), "FAKE_ENGINE_START_DELAY_S": "0.2"}
            )
            try:
                if version % 5 == 0:
                    status = client.delete("/v1/configs/soak/cfg").status_code
                else:
                    status = client.put("/v1/configs/soak/cfg", json=config).status_code
            except httpx.HTTPError as exc:
                tally.add("transport error", f"config: {exc!r}")
                continue
            tally.add(f"config {status}", None if status in (200, 201, 404) else str(status))


def _run_load(worker: Worker, seconds: float, clients: int, tally: Tally, seed: int) -> float:
    """Run the mixed load for ``seconds``; return the peak RSS (MiB) seen meanwhile."""
    stop = threading.Event()
    threads = [
        threading.Thread(target=_client, args=(worker, seed + i, stop, tally), daemon=True)
        for i in range(clients)
    ]
    threads.append(threading.Thread(target=_config_writer, args=(worker, stop, tally)))
    for thread in threads:
        thread.start()
    peak = 0.0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(min(5.0, max(deadline - time.monotonic(), 0.0)))
        peak = max(peak, Sample.of(worker).rss_mib)
        engines = len(worker.engines())
        if engines > 2:  # two devices: at most two engines (plus ones draining)
            tally.add("engines over device count", f"{engines} engines alive")
    stop.set()
    for thread in threads:
        thread.join(180)
    return peak


def _quiesce(worker: Worker) -> None:
    """Wait until no request is in flight, then unload every model and wait for its engine
    to be gone, so that the start and end figures compare the same state: no engine."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        models = worker.models().values()
        if all(m["inflight"] == 0 and m["state"] != "loading" for m in models):
            break
        time.sleep(0.5)
    with worker.client() as client:
        for model in worker.models():
            client.post(f"/v1/models/{model}/unload")
    deadline = time.monotonic() + 60
    while worker.engines() and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(2.0)  # let closed connections and reaped processes settle


def _metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _section(args: argparse.Namespace, figures: dict[str, Any]) -> str:
    start, end = figures["start"], figures["end"]
    rows = [
        (
            "resident memory (MiB)",
            f"{start.rss_mib:.1f}",
            f"{end.rss_mib:.1f}",
            f"{(end.rss_mib / start.rss_mib - 1) * 100:+.1f}%",
        ),
        ("open file descriptors", start.fds, end.fds, f"{end.fds - start.fds:+d}"),
        ("threads", start.threads, end.threads, f"{end.threads - start.threads:+d}"),
        (
            "processes (engines + ranks)",
            start.processes,
            end.processes,
            f"{end.processes - start.processes:+d}",
        ),
        (
            "TCP sockets",
            start.connections,
            end.connections,
            f"{end.connections - start.connections:+d}",
        ),
    ]
    table = "\n".join(f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows)
    answers = ", ".join(f"{k} {v}" for k, v in sorted(figures["answers"].items()))
    verdict = "**met**" if figures["leak_ok"] else "**not met**"
    odd = "".join(f"\n- `{p}`" for p in figures["problems"][:3])
    odd = f":{odd}" if odd else ""
    machine = f"{os.cpu_count()} shared CPU cores, Python {platform.python_version()}"
    return f"""{_SECTION}

What it measures: whether a worker under minutes of mixed load with evictions leaks memory,
file descriptors, threads or processes (issue 10, item 5). Not part of the test command.

```sh
.venv/bin/python tests/reliability/soak.py              # 10 min + warm-up; writes this section
.venv/bin/python tests/reliability/soak.py --minutes 1 --no-record   # quick look, no writing
```

Exit status 1 when RSS grew by more than 10%, file descriptors by more than 32, an engine
process outlived its model, or an answer was neither a 200 nor a DESIGN.md error.

**Setup.** One `sie-worker serve` with 2 devices and 6 models (four of width 1, one an
embedding model; two of width 2) behind fake SGLang engines that start in 0.2-0.6 s.
Client threads ({args.clients}) send streamed and plain completions and chats, embeddings,
`Prefer: wait=0` requests, explicit loads/unloads and, now and then, a fault (an engine that
dies mid-stream, a broken event stream), honouring `Retry-After`; one more thread writes and
deletes a config every 3 s. Measured after a warm-up of the same load ({args.warmup:g} s;
start) and once the load stopped (end), both times with every model unloaded and its
engine gone, so that the two states compare.

**Results** ({machine}, other jobs running; one run, {figures["date"]}, {args.minutes:g} min):

| figure | start | end | change |
|---|---:|---:|---:|
{table}

Peak RSS during the load: {figures["peak"]:.1f} MiB. Model loads: {figures["loads"]:.0f};
evictions to make room: {figures["evictions"]:.0f}; engine crashes: {figures["crashes"]:.0f}.
Requests answered: {figures["requests"]}, by answer: {answers}.

Target (RSS growth <= 10%, no leaked descriptor, thread or process): {verdict}.
Answers that were neither a 200 nor a DESIGN.md error: {len(figures["problems"])}{odd}.
"""


def _tracebacks(log: str) -> list[str]:
    """Every traceback in the worker's log, with the line that announced it."""
    found, lines = [], log.splitlines()
    for index, line in enumerate(lines):
        if line.startswith("Traceback"):
            end = index + 1
            while end < len(lines) and (lines[end].startswith((" ", "\t")) or not lines[end]):
                end += 1
            found.append("\n".join(lines[max(index - 1, 0) : end + 1]))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="measured load (10)")
    parser.add_argument("--warmup", type=float, default=60.0, help="seconds before start (60)")
    parser.add_argument("--clients", type=int, default=8, help="client threads (8)")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "benchmarks.md")
    parser.add_argument("--no-record", action="store_true", help="print, do not write")
    args = parser.parse_args(argv)

    command = shlex.join([sys.executable, str(FAKE_ENGINE_SCRIPT), "--fake-parser=minimal"])
    configs = [
        fake_model(m, width=w, task=t, env={"FAKE_ENGINE_START_DELAY_S": d})
        for m, (w, t, d) in _MODELS.items()
    ]
    with tempfile.TemporaryDirectory(prefix="sie-soak-") as scratch:
        launcher = Launcher(Path(scratch), command)
        worker = launcher.start(configs, env={"SIE_DRAIN_TIMEOUT_S": "30"})
        ok = True
        try:
            tally = Tally()
            print(f"warm-up {args.warmup:g} s ...", flush=True)
            _run_load(worker, args.warmup, args.clients, tally, args.seed)
            _quiesce(worker)
            start = Sample.of(worker)
            tally = Tally()
            print(f"start: {start}; load for {args.minutes:g} min ...", flush=True)
            peak = _run_load(worker, args.minutes * 60, args.clients, tally, args.seed + 100)
            _quiesce(worker)
            end = Sample.of(worker)
            print(f"end:   {end}", flush=True)
            metrics = loopback.get(worker.url + "/metrics", timeout=30).text
            try:
                assert_clean(worker, probe="soak/g1")
            except AssertionError as exc:
                ok = False
                tally.problems.append(f"end state: {exc}")
        finally:
            leftovers = launcher.close()
        growth = end.rss_mib / start.rss_mib - 1
        leak_ok = ok and growth <= _RSS_GROWTH_LIMIT and end.fds - start.fds <= _FD_GROWTH_LIMIT
        leak_ok = leak_ok and not leftovers
        ok = leak_ok and not tally.problems
        figures = {
            "start": start,
            "end": end,
            "peak": peak,
            "answers": tally.answers,
            "requests": sum(v for k, v in tally.answers.items() if not k.startswith("config")),
            "loads": _metric(metrics, 'sie_model_loads_total{outcome="ready"}'),
            "evictions": _metric(metrics, 'sie_model_evictions_total{reason="make_room"}'),
            "crashes": _metric(metrics, 'sie_model_evictions_total{reason="engine_exit"}'),
            "date": datetime.date.today().isoformat(),
            "leak_ok": leak_ok,
            "problems": tally.problems,
        }
        section = _section(args, figures)
        print(section)
        for problem in tally.problems[:20]:
            print("problem:", problem)
        for code, message in sorted(tally.examples.items()):
            print(f"e.g. {code}: {message}")
        if not ok:  # the worker's own account of what went wrong, before its log is gone
            print("\n".join(_tracebacks(worker.logs())[:5]))
        if leftovers:
            print("engine processes outlived the worker:", leftovers)
        if not args.no_record:
            record_section(args.output, section)
            print(f"recorded in {args.output}")
    return 0 if ok else 1


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
