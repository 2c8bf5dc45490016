"""Write ``docs/benchmarks.md`` (and ``docs/img/bench-stream.png``) from one run's results.

Reads ``tests/bench/out/*.json`` as written by the ``bench_*.py`` modules and ``run.json``
as written by ``tests/bench/runner.py``. Sections of the existing document that this
report does not generate (``## Router policy vs round robin``, ``## Soak``, any other) are
kept verbatim, after the generated ones, in their order.

    .venv/bin/python -m tests.bench.report
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.bench import bench_fetch, bench_placement
from tests.bench._bench import OUT, ROOT

__all__ = ["main", "render", "split_sections"]

DOC = ROOT / "docs" / "benchmarks.md"
PLOT = ROOT / "docs" / "img" / "bench-stream.png"
GENERATED = (
    "Summary",
    "Machine and command",
    "1. Streaming proxy overhead",
    "2. Placement decision time",
    "3. Load overhead",
    "4. Worker footprint",
    "5. Chart render time",
    "6. Weights: fetch vs a file copy",
)
_PATH_ORDER = ("direct", "nginx", "worker", "router+worker", "worker@baseline")
_RATE = "50 tok/s"


@dataclass(frozen=True)
class Target:
    name: str
    measured: str
    target: str
    ratio: float | None  # measured / target, as the target reads (>= or <=)
    met: bool | None  # None: not measured
    note: str = ""


def split_sections(text: str) -> tuple[str, list[tuple[str, str]]]:
    """The text before the first ``## `` heading, and each ``## `` section (title, body)."""
    parts = re.split(r"(?m)^## ", text)
    head, sections = parts[0], []
    for part in parts[1:]:
        title, _, body = part.partition("\n")
        sections.append((title.strip(), body))
    return head, sections


def record_section(path: Path, section: str) -> None:
    """Put ``section`` (its first line a ``## `` heading) into ``path``: in place of the
    section with that heading, else at the end; every other section is kept as it is."""
    heading, _, body = section.removeprefix("## ").partition("\n")
    title, body = heading.strip(), body.rstrip("\n") + "\n\n"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    head, sections = split_sections(text)
    if any(t == title for t, _ in sections):
        sections = [(t, body if t == title else b) for t, b in sections]
    else:
        if sections:
            sections[-1] = (sections[-1][0], sections[-1][1].rstrip("\n") + "\n\n")
        else:
            head = head.rstrip("\n") + "\n\n"
        sections.append((title, body))
    doc = head + "".join(f"## {t}\n{b}" for t, b in sections)
    path.write_text(doc.rstrip("\n") + "\n")


def _load(name: str) -> dict[str, Any] | None:
    path = OUT / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _ms(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value * 1000:.{digits}f}"


def _signed_ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:+.1f}"


def _num(value: float | None, fmt: str = "{:,.0f}") -> str:
    return "-" if value is None else fmt.format(value)


def _mark(met: bool | None) -> str:
    return {True: "**met**", False: "**not met**", None: "not measured"}[met]


def _cell(cells: Sequence[Mapping[str, Any]], path: str, mode: str, streams: int) -> Any:
    for cell in cells:
        if cell["path"] == path and cell["mode"] == mode and cell["concurrency"] == streams:
            return cell
    return None


def _get(cell: Mapping[str, Any] | None, key: str) -> Any:
    return None if cell is None else cell.get(key)


def _div(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def _sub(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


# --- targets -------------------------------------------------------------------------------


def _stream_targets(stream: Mapping[str, Any] | None) -> list[Target]:
    if stream is None:
        return [Target("streaming benchmark", "-", "-", None, None, "did not run")]
    cells = stream["cells"]
    direct_rate = _cell(cells, "direct", _RATE, 64)
    worker_rate = _cell(cells, "worker", _RATE, 64)
    nginx_rate = _cell(cells, "nginx", _RATE, 64)
    worker_fast = _cell(cells, "worker", "fast", 64)
    nginx_fast = _cell(cells, "nginx", "fast", 64)
    direct_fast = _cell(cells, "direct", "fast", 64)
    keep = _div(_get(worker_rate, "events_per_s"), _get(direct_rate, "events_per_s"))
    worker_256 = _cell(cells, "worker", _RATE, 256)
    direct_256 = _cell(cells, "direct", _RATE, 256)
    keep_256 = _div(_get(worker_256, "events_per_s"), _get(direct_256, "events_per_s"))
    itl_256 = _sub(_get(worker_256, "itl_p99_s"), _get(direct_256, "itl_p99_s"))
    keep_fast = _div(_get(worker_fast, "events_per_s"), _get(direct_fast, "events_per_s"))
    added_itl = _sub(_get(worker_rate, "itl_p99_s"), _get(direct_rate, "itl_p99_s"))
    rate = _get(worker_fast, "events_per_s")
    cpu_us = _get(worker_fast, "proxy_cpu_us_per_event")
    capacity = None if not cpu_us else 1e6 / cpu_us
    nginx_cpu = _get(nginx_fast, "proxy_cpu_us_per_event")
    cpu_ratio = _div(cpu_us, nginx_cpu)
    ttft_worker = _sub(_get(worker_rate, "ttft_p50_s"), _get(direct_rate, "ttft_p50_s"))
    ttft_nginx = _sub(_get(nginx_rate, "ttft_p50_s"), _get(direct_rate, "ttft_p50_s"))
    return [
        Target(
            "Worker keeps ≥ 95% of direct throughput, 64 streams at 50 tok/s",
            f"{_num(keep, '{:.1%}')} ({_num(_get(worker_rate, 'events_per_s'))} vs "
            f"{_num(_get(direct_rate, 'events_per_s'))} events/s)",
            "≥ 95%",
            _div(keep, 0.95),
            None if keep is None else keep >= 0.95,
            f"256 streams: {_num(keep_256, '{:.1%}')} (one core runs out: see 'What is left'); "
            f"engine streaming flat out, 64 streams: {_num(keep_fast, '{:.1%}')} (the proxy is "
            "then the bottleneck by design; its ceiling is the next-but-one row)",
        ),
        Target(
            "Worker adds ≤ 2 ms p99 inter-token latency, 64 streams at 50 tok/s",
            f"{_ms(added_itl, 2)} ms ({_ms(_get(worker_rate, 'itl_p99_s'), 2)} vs "
            f"{_ms(_get(direct_rate, 'itl_p99_s'), 2)} ms)",
            "≤ 2 ms",
            _div(added_itl, 0.002) if added_itl is not None and added_itl > 0 else 0.0,
            None if added_itl is None else added_itl <= 0.002,
            f"256 streams: {_signed_ms(itl_256)} ms; every concurrency is in the tables below",
        ),
        Target(
            "Worker sustains ≥ 25k SSE events/s on one core (fast engine, 64 streams)",
            f"{_num(rate)} events/s measured; {_num(capacity)} per CPU-second "
            f"({_num(cpu_us, '{:.1f}')} µs of worker CPU per event)",
            "≥ 25,000/s",
            _div(rate, 25000),
            None if rate is None else rate >= 25000,
            "measured with the worker pinned alone to CPU 1",
        ),
        Target(
            "Worker's added overhead within 2x nginx's (CPU per relayed event, fast, 64 streams)",
            f"{_num(cpu_us, '{:.1f}')} vs {_num(nginx_cpu, '{:.1f}')} µs/event "
            f"= {_num(cpu_ratio, '{:.1f}')}x",
            "≤ 2x",
            _div(cpu_ratio, 2.0),
            None if cpu_ratio is None else cpu_ratio <= 2.0,
            f"latency at 50 tok/s, 64 streams: TTFT p50 {_signed_ms(ttft_worker)} ms (worker) vs "
            f"{_signed_ms(ttft_nginx)} ms (nginx); see 'What is left'",
        ),
    ]


def _other_targets(data: Mapping[str, Any | None]) -> list[Target]:
    out = []
    placement = data["placement"]
    if placement:
        t = placement["target"]
        raw = t.get("raw_us", placement["runs"][0]["raw_us"]["p99"])
        out.append(
            Target(
                "Placement: `place()` p99 ≤ 50 µs at 8 devices x 200 models, memory in play",
                f"{t['value_us']:.1f} µs, worst of exclusive / spread / pack "
                f"({t.get('worst_mode', 'exclusive')}; single pass, scheduler noise "
                f"included: {raw:.1f} µs)",
                "≤ 50 µs",
                t["value_us"] / t["limit_us"],
                t["met"],
            )
        )
    load = data["load"]
    if load:
        t = load["target"]
        out.append(
            Target(
                "Load overhead: load-to-ready minus the engine's own start-up",
                f"{t['value_s'] * 1000:.0f} ms median "
                f"(p90 {load['overhead_s']['p90'] * 1000:.0f} ms)",
                "≤ 50 ms",
                t["value_s"] / t["limit_s"],
                t["met"],
            )
        )
    footprint = data["footprint"]
    if footprint:
        rss, modules = footprint["targets"]
        out.append(
            Target(
                "Footprint: worker RSS with no engines",
                f"{rss['value_mb']:.1f} MB (largest of the idle stages)",
                "≤ 100 MB",
                rss["value_mb"] / rss["limit_mb"],
                rss["met"],
            )
        )
        out.append(
            Target(
                "Footprint: no torch / transformers / sglang in the worker process",
                ", ".join(modules["value"]) or "none imported",
                "none",
                None,
                modules["met"],
            )
        )
    chart = data["chart"]
    if chart:
        t = chart["target"]
        out.append(
            Target(
                f"Chart: `helm template`, {chart['pools']} pools x 2 bundles",
                f"{t['value_s']:.2f} s median of {chart['seconds']['n']}",
                "≤ 2 s",
                t["value_s"] / t["limit_s"],
                t["met"],
            )
        )
    fetch = data.get("fetch")
    if fetch:
        t = fetch["target"]
        out.append(
            Target(
                "Weights: `sie-worker fetch` from a hub endpoint vs a file copy of the same bytes",
                f"{t['value']:.0%} ({fetch['fetch_mb_s']:.0f} vs {fetch['copy_mb_s']:.0f} MB/s)",
                "≥ 80%",
                t["value"] / t["floor"],
                t["met"],
            )
        )
    lora = data.get("lora")
    if lora:
        t, cells = lora["target"], lora["cells"]
        base = cells["base alone"]["requests_per_s"]
        out.append(
            Target(
                "Multi-LoRA, default engine: 4 adapters mixed keep ≥ 90% of 1 adapter's requests/s",
                f"{t['value']:.0%} ({cells['4 adapters mixed']['requests_per_s']:.1f} vs "
                f"{cells['1 adapter']['requests_per_s']:.1f} requests/s)",
                "≥ 90%",
                t["value"] / t["floor"],
                t["met"],
                note=f"base alone {base:.1f} requests/s on the same worker; see 'Multi-LoRA'",
            )
        )
    sharing = data.get("sharing")
    if sharing:  # tests/bench/bench_sharing.py
        loads, fewest = sharing["target"]["loads_at_4"], sharing["fewest_gpus"]
        out.append(
            Target(
                "Sharing: a simulated day of 20 small models needs fewer loads and GPUs than "
                "exclusive claims",
                f"4 GPUs: {loads['spread']:,} vs {loads['exclusive']:,} loads (spread vs "
                f"exclusive); ≤ {sharing['max_loads']} loads on {fewest['spread'] or '-'} vs "
                f"{fewest['exclusive'] or '-'} GPUs",
                "fewer",
                loads["spread"] / loads["exclusive"] if loads["exclusive"] else None,
                sharing["target"]["met"],
                note="see 'Sharing GPUs: a simulated day'",
            )
        )
    resume = data.get("resume")
    if resume:  # tests/bench/bench_resume.py
        paced = next(r for r in resume["rows"] if r["mode"] == "50 tok/s")
        share = paced["extra_share"]
        out.append(
            Target(
                "Stream resumption: keeping the text adds ≤ 10% to a router's CPU per event "
                "(64 streams at 50 tok/s)",
                f"{paced['on_us']:.1f} vs {paced['off_us']:.1f} µs/event = {share:+.1%}",
                "≤ +10%",
                None if share is None else max(share, 0.0) / 0.10,
                None if share is None else share <= 0.10,
                note="see 'Stream resumption: keeping the text'",
            )
        )
    return out


# --- sections ------------------------------------------------------------------------------


def _summary(targets: Iterable[Target]) -> str:
    rows = [
        "| target | measured | target | measured / target | result |",
        "|---|---|---|---:|---|",
    ]
    for t in targets:
        ratio = "-" if t.ratio is None else f"{t.ratio:.2f}"
        note = f"<br><sub>{t.note}</sub>" if t.note else ""
        rows.append(f"| {t.name}{note} | {t.measured} | {t.target} | {ratio} | {_mark(t.met)} |")
    return "\n".join(rows)


def _machine(run: Mapping[str, Any] | None, any_result: Mapping[str, Any] | None) -> str:
    machine = (run or {}).get("machine") or (any_result or {}).get("machine") or {}
    lines = [
        f"- Machine: {machine.get('nproc', '?')} CPUs ({machine.get('cpu_model', '?')}), "
        f"{machine.get('memory_gib', '?')} GiB, Linux {machine.get('kernel', '?')}, "
        f"Python {machine.get('python', '?')}.",
    ]
    if run:
        loads = ", ".join(f"{x:.1f}" for x in run.get("loadavg", []))
        lines += [
            f"- Command: `{run['command']}` (from the repository root), "
            f"{run['started']}, {run['seconds'] / 60:.1f} min in all.",
            f"- Load average (1 min) sampled before each benchmark and at the end: {loads}. "
            "The machine is shared with other work, so wall-clock figures move from run to "
            "run; CPU time per event (nanosecond `schedstat`) and ratios within one run move "
            "much less.",
            "- Bytecode: benchmark processes write and use `.pyc` files under "
            "`tests/bench/out/pycache` (the image ships compiled bytecode; without it every "
            "Python process here recompiles what it imports at each start).",
        ]
        for name, status in run.get("benches", {}).items():
            if status["exit"] != 0:
                lines.append(
                    f"- **{name} failed** (exit {status['exit']}); its log is "
                    f"`tests/bench/out/{name}.log`."
                )
    return "\n".join(lines)


def _stream_table(cells: Sequence[Mapping[str, Any]], mode: str, paths: Sequence[str]) -> str:
    rows = [
        "| streams | path | events/s | vs direct | TTFT p50 / p99 (ms) | ITL p50 / p99 (ms) "
        "| proxy CPU µs/event | proxy CPU share | errors |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    concurrencies = sorted({c["concurrency"] for c in cells if c["mode"] == mode})
    for streams in concurrencies:
        direct = _cell(cells, "direct", mode, streams)
        for path in paths:
            cell = _cell(cells, path, mode, streams)
            if cell is None:
                continue
            ratio = _div(cell["events_per_s"], _get(direct, "events_per_s"))
            cpu = cell["proxy_cpu_us_per_event"]
            share = cell["proxy_cpu_share"]
            rows.append(
                f"| {streams} | {path} | {cell['events_per_s']:,.0f} | {_num(ratio, '{:.2f}')} "
                f"| {_ms(cell['ttft_p50_s'])} / {_ms(cell['ttft_p99_s'])} "
                f"| {_ms(cell['itl_p50_s'], 2)} / {_ms(cell['itl_p99_s'], 2)} "
                f"| {_num(cpu, '{:.1f}')} | {_num(share, '{:.2f}')} | {cell['errors']} |"
            )
    return "\n".join(rows)


def _profile_table(profile: Mapping[str, Any], key: str, n: int = 8) -> str:
    if "error" in profile:
        return f"(profile failed: {profile['error']})"
    rows = [f"| {key} | share of samples |", "|---|---:|"]
    for row in profile[key][:n]:
        frame = row["frame"].replace("|", "\\|")
        rows.append(f"| `{frame}` | {row['share']:.1%} |")
    return "\n".join(rows)


def _stream_section(stream: Mapping[str, Any] | None) -> str:
    if stream is None:
        return "Not measured: `bench_stream` did not produce results (see its log).\n"
    cells = stream["cells"]
    paths = [p for p in _PATH_ORDER if any(c["path"] == p for c in cells)]
    pinned = stream["pinned"]
    baseline = stream.get("baseline")
    parts = [
        "One fake SGLang engine (`tests/support/fake_engine.py --fake-parser=minimal`, "
        "started by the worker's own load) serves every path, so the paths differ only in "
        "what sits in front of it:",
        "",
        "- **direct**: the engine's own port;",
        f"- **nginx**: {(stream.get('nginx') or 'nginx').removeprefix('nginx version: ')} "
        "as an SSE reverse proxy "
        "(`proxy_buffering off`, HTTP/1.1 upstream keep-alive, one worker process, "
        "127.0.0.1, foreground with a temporary prefix);",
        "- **worker**: `sie-worker serve` with the model loaded;",
        "- **router+worker**: `sie-worker route` (`SIE_GPU_COUNT=1 "
        "SIE_WORKER_PORTS=<worker port>`) in front of the same worker;",
    ]
    if baseline:
        parts.append(
            f"- **worker@baseline**: the same worker with `proxy.py` as of `{baseline}` "
            "(before the fixes below), on its own engine started by the same command."
        )
    parts += [
        "",
        "Load: `tests/bench/loadgen.py`, a separate process (uvloop, raw asyncio protocols: "
        "per segment it only timestamps, undoes the chunked framing and counts event "
        "boundaries; proxies re-chunk, so events can straddle chunks). Each client opens a "
        "connection, sends one streaming `POST /v1/completions`, reads to `[DONE]` and starts "
        "over; clients start at random moments of the warm-up, so that new requests do not "
        f"all arrive at once; {stream['warmup_s']:g} s of warm-up, then a "
        f"{stream['duration_s']:g} s window per cell, the paths taking turns within each cell. "
        + _repeats(stream)
        + " Engine speeds: **fast** "
        f"(`fake.fast`: {stream['fast_tokens']} events per stream as fast as the engine can "
        f"write them) and **{_RATE}** (`fake.token_delay_s: 0.02`, {stream['rate_tokens']} "
        "events per stream). Each stream also carries a finish event and `[DONE]`; events/s "
        "counts them all. TTFT: request sent to first event. ITL: gap between consecutive "
        "events of a stream; events that arrive in one segment share a timestamp, so with a "
        "fast engine most gaps are 0.",
        "",
        (
            "Pinning: nginx, the worker and the router run on CPU 1, the engine and the load "
            "generator on CPU 0 (`taskset`; the engine is re-pinned after the worker starts "
            'it). "On one core" below means the worker alone on CPU 1. Proxy CPU is the '
            "proxy tier's CPU time in the window (nginx: master and worker; router+worker: "
            "both processes) divided by the events relayed; its share is of one core."
            if pinned
            else "Pinning: not available (fewer than two CPUs allowed); nothing was pinned."
        ),
        "",
        _contention(cells, pinned),
        "",
        f"![events/s and p99 ITL vs concurrency per path](img/{PLOT.name})",
        "",
        "### Engine streaming flat out (fast)",
        "",
        _stream_table(cells, "fast", paths),
        "",
        f"### Engine at {_RATE} per stream",
        "",
        _stream_table(cells, _RATE, paths),
        "",
    ]
    unavailable = stream.get("unavailable") or {}
    for name, why in unavailable.items():
        if why != "not selected":
            parts += [f"**{name}: not measured** - {why}", ""]
    parts += _fix_section(stream, paths)
    return "\n".join(parts)


def _repeats(stream: Mapping[str, Any]) -> str:
    repeats = stream.get("repeats", 1)
    if repeats < 2:
        return "Each cell ran once."
    others = [c.get("others_cpu_share", 0.0) for c in stream["cells"]]
    return (
        f"Each cell ran {repeats} times and every path keeps the try in which other "
        "processes on the machine used the least CPU (both CPUs' busy time minus the proxy's, "
        "the engine's and the load generator's; chosen without looking at the results); in "
        f"the kept tries they used at most {max(others):.0%} of a core."
    )


def _contention(cells: Sequence[Mapping[str, Any]], pinned: bool) -> str:
    """How busy the client was, and how much of the proxy's core went to other work."""
    client = max(cells, key=lambda c: c["client_cpu_share"])
    text = (
        f"The load generator used at most {client['client_cpu_share']:.0%} of its core "
        f"({client['path']}, {client['mode']}, {client['concurrency']} stream"
        f"{'s' if client['concurrency'] > 1 else ''}), so it was not "
        "what limited a path."
    )
    cell = _cell(cells, "worker", "fast", 64)
    if pinned and cell is not None and cell.get("core_busy"):
        text += (
            f" In the fast 64-stream worker cell CPU 1 was busy {cell['core_busy'][1]:.0%} of "
            f"the time and the worker itself used {cell['proxy_cpu_share']:.0%} of it: the "
            "difference was other processes on this shared machine, which is why the "
            "CPU-per-event column is the steadier measure."
        )
    return text


def _fix_section(stream: Mapping[str, Any], paths: Sequence[str]) -> list[str]:
    cells = stream["cells"]
    profiles = stream.get("profiles") or {}

    def ratio(mode: str, streams: int, key: str) -> str:
        now = _get(_cell(cells, "worker", mode, streams), key)
        before = _get(_cell(cells, "worker@baseline", mode, streams), key)
        value = _div(now, before)
        return "-" if value is None else f"{value:.2f}x"

    def focus(key: str, frame: str) -> str:
        value = (profiles.get(key) or {}).get("focus", {}).get(frame)
        return "-" if value is None else f"{value:.0%}"

    def per_event(key: str, frame: str) -> str:
        """``frame``'s share of ``key``'s profile as µs of CPU per relayed event."""
        path, _, mode = key.partition(" ")
        profile = profiles.get(key) or {}
        share = profile.get("focus", {}).get(frame)
        cpu = _get(_cell(cells, path, mode, profile.get("streams", 64)), "proxy_cpu_us_per_event")
        value = None if share is None or cpu is None else share * cpu
        return "-" if value is None else f"~{value:.1f} µs per event"

    def profiled(key: str) -> str:
        return str((profiles.get(key) or {}).get("streams", "-"))

    pool = "AsyncConnectionPool._assign_requests_to_connections"
    downstream = "StreamingResponse.stream_response"
    upstream_httpx = "Response.aiter_raw"
    upstream_raw = "UpstreamAnswer.data_received"
    lines = [
        "### Profile and fix",
        "",
        "py-spy (`py-spy record --nonblocking --rate 200`, idle time excluded) sampled each "
        "worker while streams ran through it (fast: 64 streams; 50 tok/s: 256, where "
        "per-stream costs dominate); the full collapsed stacks are in "
        "`tests/bench/out/profile-*.txt`. Shares below are of the samples in which the "
        "named function was on the stack. Before the fixes the worker spent its time in:",
        "",
        "1. **httpx's connection pool** (httpcore 1.0.9 `_assign_requests_to_connections`): "
        "on every request start *and* end it walks every pooled connection, asks each idle "
        "one whether its socket is readable (anyio builds a dict of lambdas per call) and, "
        "per idle connection, counts the whole pool again: quadratic in the number of "
        f"connections. With {profiled(f'worker@baseline {_RATE}')} streams of 50 tok/s "
        f"starting and ending it was {focus(f'worker@baseline {_RATE}', pool)} of the samples (now "
        f"{focus(f'worker {_RATE}', pool)}). **Fix:** streams no longer use the pool (fix 3): "
        "each has its own engine connection, which the worker closes once `[DONE]` has "
        "arrived, before the engine's end of body; a stream lasts seconds, a loopback "
        "connect costs well under a millisecond. The worker closing first also leaves the "
        "TIME_WAIT on its own ephemeral port rather than on the engine's port (a first try "
        "with `Connection: close` left one per stream there, and the worker's port picker "
        "counts those ports as taken). Non-streaming requests keep httpx's keep-alive pool.",
        "2. **One write per event**: every SSE event the engine sent became its own trip "
        "through Starlette's `StreamingResponse`, the middleware send wrappers and uvicorn's "
        "`send` (a `transport.write` each): with a fast engine the downstream side "
        f"(`{downstream}`) was {focus('worker@baseline fast', downstream)} of the samples, "
        f"{per_event('worker@baseline fast', downstream)} (now "
        f"{focus('worker fast', downstream)}, {per_event('worker fast', downstream)}). "
        "**Fix:** the engine's socket is read as "
        "data arrives, independently of the relay; the relay takes everything that arrived "
        "since its last write and sends it as one chunk (still only whole events; at most "
        "1 MiB buffered, past which reading pauses, so a slow client still slows the "
        "engine's stream). At a steady 50 tok/s there is one event per write, as before; "
        "when the engine is faster than the client side, writes carry as many events as "
        "have arrived.",
        "3. **HTTP parsing of the engine's stream in Python**: an engine sends every SSE "
        "event as its own HTTP chunk, and httpx handles each one through h11 (a chunk-header "
        "regex, a `Data` event, state checks) and then httpcore's, anyio's and httpx's async "
        "generators: the upstream side (`Response.aiter_raw`) was "
        f"{focus('worker@baseline fast', upstream_httpx)} of the baseline's samples with a "
        f"fast engine, {per_event('worker@baseline fast', upstream_httpx)}. "
        "**Fix:** streams go through `sie_worker.http.upstream`, an asyncio "
        "protocol that sends the one request and lets httptools (the C parser uvicorn "
        "already uses) undo the chunked framing; its buffer is what the relay takes from. "
        f"The upstream side (`{upstream_raw}`) is now "
        f"{focus('worker fast', upstream_raw)} of the samples, "
        f"{per_event('worker fast', upstream_raw)}. Failures are raised as "
        "httpx's exception types, so both paths are translated to `engine_timeout` / "
        "`engine_unavailable` in one place.",
        "",
        "The router (`sie-worker route`) relays to its worker through the same client "
        "(`router_relay`): a connection per relayed request, closed once the answer is "
        "complete, parsed by httptools, and everything that arrived since the last write "
        "sent in one write. Its pool bookkeeping "
        f"(`{pool}`) is {focus(f'router+worker {_RATE}', pool)} of the router's samples "
        f"at 50 tok/s ({profiled(f'router+worker {_RATE}')} streams; profile below).",
        "",
    ]
    if "worker@baseline" in paths:
        lines += [
            "Same run, worker now vs worker@baseline (CPU per event, lower is better; "
            "events/s, higher is better):",
            "",
            "| cell | CPU µs/event now / before | events/s now / before |",
            "|---|---:|---:|",
        ]
        for mode in ("fast", _RATE):
            for streams in sorted({c["concurrency"] for c in cells}):
                lines.append(
                    f"| {mode}, {streams} stream{'s' if streams > 1 else ''} | "
                    f"{ratio(mode, streams, 'proxy_cpu_us_per_event')} | "
                    f"{ratio(mode, streams, 'events_per_s')} |"
                )
        lines.append("")
    for key in (
        "worker fast",
        "worker@baseline fast",
        f"worker {_RATE}",
        f"worker@baseline {_RATE}",
    ):
        profile = profiles.get(key)
        if not profile:
            continue
        lines += [
            f"Profile **{key}**, {profile.get('streams', 64)} streams "
            f"({profile.get('samples', 0)} samples), by package "
            "and by function (self time):",
            "",
            _profile_table(profile, "packages", 6),
            "",
            _profile_table(profile, "self", 6),
            "",
        ]
    for mode in ("fast", _RATE):
        router = profiles.get(f"router+worker {mode}")
        if router:
            lines += [
                f"Profile **router** (the `sie-worker route` process), {mode}, "
                f"{router.get('streams', 64)} streams "
                f"({router.get('samples', 0)} samples):",
                "",
                _profile_table(router, "self", 6),
                "",
            ]
    fast_cpu = _get(_cell(cells, "worker", "fast", 64), "proxy_cpu_us_per_event")
    nginx_fast_cpu = _get(_cell(cells, "nginx", "fast", 64), "proxy_cpu_us_per_event")
    rate_cpu = _get(_cell(cells, "worker", _RATE, 64), "proxy_cpu_us_per_event")
    nginx_rate_cpu = _get(_cell(cells, "nginx", _RATE, 64), "proxy_cpu_us_per_event")
    heavy = max(
        (c for c in cells if c["path"] == "worker" and c["mode"] == _RATE),
        key=lambda c: c["concurrency"],
        default=None,
    )
    heavy_streams = _get(heavy, "concurrency")
    heavy_direct = _cell(cells, "direct", _RATE, heavy_streams) if heavy else None
    kept = _div(_get(heavy, "events_per_s"), _get(heavy_direct, "events_per_s"))
    tail = _sub(_get(heavy, "itl_p99_s"), _get(heavy_direct, "itl_p99_s"))
    ceiling = _div(1e6, _get(heavy, "proxy_cpu_us_per_event"))
    ratio = _div(fast_cpu, nginx_fast_cpu)

    def self_share(key: str, frame: str) -> str:
        rows = (profiles.get(key) or {}).get("self", [])
        share = sum(r["share"] for r in rows if r["frame"].startswith(frame + " "))
        return f"{share:.0%}"

    if ratio is not None and ratio > 2:
        cpu_note = (
            f"- **CPU per event against nginx (not met, {ratio:.1f}x).** The worker's "
            "profile above shows where it goes."
        )
    else:
        cpu_note = (
            f"- **CPU per event with a fast engine** ({_num(ratio, '{:.1f}')}x nginx's, met). "
            "What is left is the relay's own Python per write: the structural check of every "
            f"`data:` line (`_malformation`, {self_share('worker fast', '_malformation')} of "
            "the worker's samples) and the `[DONE]` check. One compiled regular expression "
            "over each batch instead of a Python loop over its lines would be the next step."
        )
    if kept is not None and kept < 0.95:
        heavy_note = f"which is why {heavy_streams} streams fall behind direct"
    else:
        heavy_note = (
            f"so {heavy_streams} streams still keep up with direct ({_num(kept, '{:.1%}')}), "
            f"but its p99 inter-token latency grows (+{_ms(tail)} ms) as the core fills"
        )
    router_rate = _cell(cells, "router+worker", _RATE, heavy_streams) if heavy else None
    router_kept = _div(_get(router_rate, "events_per_s"), _get(heavy_direct, "events_per_s"))
    lines += [
        "### What is left",
        "",
        cpu_note,
        f"- **Low per-stream rates.** At {_RATE} every event is its own read, wake-up and "
        "write, and each request pays uvicorn + Starlette set-up, the worker's lease and its "
        f"engine call: the worker spends {_num(rate_cpu, '{:.0f}')} µs of CPU per "
        f"event at 64 streams there (nginx: {_num(nginx_rate_cpu, '{:.0f}')} µs), against "
        f"{_num(fast_cpu, '{:.1f}')} µs when events arrive in batches. Its largest self-time "
        "entries there are the event loop itself (`Runner.run`, "
        f"{self_share(f'worker {_RATE}', 'Runner.run')}) and uvicorn's "
        "`RequestResponseCycle.send` "
        f"({self_share(f'worker {_RATE}', 'RequestResponseCycle.send')}): per-write costs of "
        "asyncio and uvicorn more than of sie-workers' own code. One core of this machine "
        f"relays about {_num(ceiling)} events/s at that rate "
        f"(~{_num(_div(ceiling, 50))} streams of 50 tok/s), {heavy_note}. The worker is one "
        "asyncio process, so more CPUs for its container do not raise this; more workers "
        "(the chart's one-GPU slots) do.",
        "- **router+worker** adds a second process on the same core (uvicorn, Starlette "
        f"and the relay again): at {heavy_streams} streams of {_RATE} the pair keeps "
        f"{_num(router_kept, '{:.0%}')} of direct, at "
        f"{_num(_get(router_rate, 'proxy_cpu_us_per_event'), '{:.0f}')} µs of CPU per event "
        "for both processes; the router's profile is above. In a pod the router has its own "
        "container and CPU request, so it does not share the worker's core.",
        "",
    ]
    return lines


def _itl_note(cells: Sequence[Mapping[str, Any]]) -> list[str]:
    worker = _cell(cells, "worker", _RATE, 64)
    direct = _cell(cells, "direct", _RATE, 64)
    added = _sub(_get(worker, "itl_p99_s"), _get(direct, "itl_p99_s"))
    if added is None or added <= 0.002:
        return []
    return [
        f"- **p99 inter-token latency at 64 streams (+{added * 1000:.1f} ms, not met).** The "
        "median gap is unchanged "
        f"({_ms(_get(worker, 'itl_p50_s'), 2)} vs {_ms(_get(direct, 'itl_p50_s'), 2)} ms); "
        "the tail comes from the single event loop: a new stream's set-up (routing, model "
        "lookup, a new engine connection through anyio, httpx request building) runs to "
        "completion before the loop relays the other streams' events, and other processes "
        "share the core. The same cost shows as TTFT. Making per-stream set-up cheaper is "
        "the lever: the raw relay above would drop httpx's and anyio's share of it; pooling "
        "engine connections without httpcore's quadratic bookkeeping would drop the "
        "connect.",
    ]


def _load_section(load: Mapping[str, Any] | None) -> str:
    if load is None:
        return "Not measured (see `tests/bench/out/bench_load.log`).\n"
    own, total, over = load["engine_start_s"], load["load_s"], load["overhead_s"]

    def row(name: str, s: Mapping[str, Any]) -> str:
        return (
            f"| {name} | {s['p50'] * 1000:.0f} | {s['p90'] * 1000:.0f} | "
            f"{s['min'] * 1000:.0f} | {s['max'] * 1000:.0f} |"
        )

    met = load["target"]["met"]
    return "\n".join(
        [
            "`POST /v1/models/{id}/load` until it answers (the model is ready), against the "
            "same engine command started directly and polled on `/health` every millisecond "
            "(`sie-worker plan` prints the command; only the ports differ). Direct starts and "
            f"worker loads alternate, {load['rounds']} rounds; overhead is each round's load "
            "time minus its direct start-up.",
            "",
            "| ms | p50 | p90 | min | max |",
            "|---|---:|---:|---:|---:|",
            row("engine's own start-up", own),
            row("load through the worker", total),
            row("overhead (per round)", over),
            "",
            (
                "Most of the overhead is how often the worker looks: `engine.wait_ready` "
                "(at the time of writing) polls `/health`, sleeps 10 ms and multiplies the "
                "sleep by 1.5 after each poll (capped at 0.5 s), so polls fall near 0, 10, "
                "25, 48, 81, 132, 208, 322 and 493 ms and an engine ready at ~0.33 s is seen "
                "at ~0.49 s. Capping the sleep at 25 ms for the first seconds would bound "
                "this part to 25 ms for about 40 more `/health` requests per 1 s start-up "
                "(`engine.py` is not the benchmark's to change; proposed to its owner)."
                if not met
                else "The overhead includes how often `engine.wait_ready` polls `/health` "
                "(back-off from 10 ms by 1.5x), which bounds how soon readiness is seen."
            ),
            "",
        ]
    )


def _footprint_section(footprint: Mapping[str, Any] | None) -> str:
    if footprint is None:
        return "Not measured (see `tests/bench/out/bench_footprint.log`).\n"
    rows = ["| stage | RSS MB | USS MB |", "|---|---:|---:|"]
    for stage, memory in footprint["stages"].items():
        rows.append(f"| {stage} | {memory['rss_mb']:.1f} | {memory['uss_mb']:.1f} |")
    serve, probe = footprint["serve_process"], footprint["app_import_probe"]
    statuses = ", ".join(f"{k}: {v}" for k, v in footprint["api_statuses"].items())
    return "\n".join(
        [
            f"A real `sie-worker serve` with {footprint['configs']} model configs "
            f"(the example models plus a fake-engine one) and {footprint['devices']} devices; "
            "RSS and USS from psutil. The API calls cycle through the probes, listings, "
            f"metrics, OpenAPI, configs and refused requests (statuses {statuses}); the "
            "engine stage loads the fake model and relays "
            f"{footprint['stream_events']} events, and measures the worker process alone.",
            "",
            *rows,
            "",
            "Modules, checked two ways: the serve process runs through "
            "`tests/bench/_serve_probe.py` (the unchanged `python -m sie_worker` via `runpy`, "
            "plus an `atexit` hook) and records every top-level package it ever imported at "
            f"exit: heavy ones: {', '.join(serve['heavy']) or 'none'} ({serve['modules']} "
            "modules in all); its memory maps list "
            f"{len(footprint['serve_mapped_heavy_files'])} torch/transformers/sglang files. A "
            "script that imports `sie_worker.worker.app` and `sie_worker.cli` and creates the app: "
            f"{', '.join(probe['heavy']) or 'none'} ({probe['modules']} modules, "
            f"{probe['rss_mb']:.1f} MB RSS).",
            "",
        ]
    )


def _chart_section(chart: Mapping[str, Any] | None) -> str:
    if chart is None:
        return "Not measured (see `tests/bench/out/bench_chart.log`).\n"
    s, cpu = chart["seconds"], chart["cpu_seconds"]
    kinds = ", ".join(f"{v} {k}" for k, v in sorted(chart["kinds"].items()))
    return "\n".join(
        [
            f"`helm template` ({chart['helm']}) of `tests/bench/out/chart-values-"
            f"{chart['pools']}x2.yaml`, generated by `bench_chart.values()`: "
            f"{chart['pools']} pools (one-GPU, four one-GPU workers per pod, 4- and 8-GPU "
            "device groups), two bundles each, the example model configs, autoscaling, a "
            "ServiceMonitor and an API key Secret; the chart's default pool off. Output: "
            f"{chart['documents']} documents ({kinds}), {chart['output_bytes'] / 1024:.0f} KiB. "
            f"One unmeasured render, then {s['n']} fresh `helm` processes.",
            "",
            "| seconds | median | min | max |",
            "|---|---:|---:|---:|",
            f"| wall | {s['median']:.3f} | {s['min']:.3f} | {s['max']:.3f} |",
            f"| helm CPU (user + system) | {cpu['median']:.3f} | {cpu['min']:.3f} | "
            f"{cpu['max']:.3f} |",
            "",
        ]
    )


# --- plot ----------------------------------------------------------------------------------


def plot(stream: Mapping[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = stream["cells"]
    paths = [p for p in _PATH_ORDER if any(c["path"] == p for c in cells)]
    colors = {name: f"C{i}" for i, name in enumerate(_PATH_ORDER)}

    def itl_ms(c: Mapping[str, Any]) -> float | None:
        return None if c["itl_p99_s"] is None else c["itl_p99_s"] * 1000

    def events(c: Mapping[str, Any]) -> float | None:
        return float(c["events_per_s"])

    def vs_direct(c: Mapping[str, Any]) -> float | None:
        direct = _cell(cells, "direct", c["mode"], c["concurrency"])
        return _div(c["events_per_s"], _get(direct, "events_per_s"))

    def cpu(c: Mapping[str, Any]) -> float | None:
        value = c["proxy_cpu_us_per_event"]
        return None if value is None else float(value)

    Value = Callable[[Mapping[str, Any]], float | None]
    panels: list[tuple[str, str, Sequence[str], Value, bool]] = [
        ("fast engine: events/s", "events/s", ["fast"], events, True),
        (f"{_RATE} per stream: events/s relative to direct", "x direct", [_RATE], vs_direct, False),
        (f"{_RATE} per stream: p99 inter-token latency", "ms", [_RATE], itl_ms, True),
        ("proxy CPU per event (solid: fast, dashed: 50 tok/s)", "µs", ["fast", _RATE], cpu, True),
    ]
    fig, axes = plt.subplots(2, 2, figsize=(11, 8), constrained_layout=True)
    for ax, (title, unit, modes, value, log_y) in zip(axes.flat, panels, strict=True):
        for name in paths:
            for mode in modes:
                points = sorted(
                    (c["concurrency"], v)
                    for c in cells
                    if c["path"] == name and c["mode"] == mode and (v := value(c)) is not None
                )
                if not points:
                    continue
                xs, ys = zip(*points, strict=True)
                style = "-" if mode == modes[0] else "--"
                label = name if mode == modes[0] else None
                ax.plot(xs, ys, style, marker="o", color=colors[name], label=label)
        ax.set_xscale("log", base=2)
        ax.set_xticks([1, 16, 64, 256], ["1", "16", "64", "256"])
        if log_y:
            ax.set_yscale("log")
        ax.set_title(title)
        ax.set_xlabel("concurrent streams")
        ax.set_ylabel(unit)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("sie-workers streaming overhead (one run of tests/bench/run)")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


# --- document ------------------------------------------------------------------------------


def render(existing: str) -> str:
    data = {
        name: _load(name)
        for name in (
            "run",
            "stream",
            "placement",
            "load",
            "footprint",
            "chart",
            "fetch",
            "lora",
            "sharing",
            "resume",
        )
    }
    targets = _stream_targets(data["stream"]) + _other_targets(data)
    any_result = next((v for v in data.values() if v), None)
    sections = {
        "Summary": "Every figure on this page comes from one run of `tests/bench/run`; each "
        "target is marked with measured / target (below 1 is good for a limit, above 1 for "
        "a floor).\n\n" + _summary(targets) + "\n",
        "Machine and command": _machine(data["run"], any_result) + "\n",
        "1. Streaming proxy overhead": _stream_section(data["stream"]),
        "2. Placement decision time": bench_placement.section(
            data["placement"], _get(data["placement"], "command")
        ),
        "3. Load overhead": _load_section(data["load"]),
        "4. Worker footprint": _footprint_section(data["footprint"]),
        "5. Chart render time": _chart_section(data["chart"]),
        "6. Weights: fetch vs a file copy": bench_fetch.section(data["fetch"])
        if data["fetch"]
        else "Not measured (see `tests/bench/out/fetch.log`).\n",
    }
    _, old_sections = split_sections(existing)
    kept = [(t, b) for t, b in old_sections if t not in GENERATED]
    head = (
        "# Benchmarks\n\n"
        "What users pay for putting sie-workers between them and the engine, and how fast "
        "its own decisions are. Generated by `tests/bench/run` (sections 1-6 and the "
        "summary are rewritten on every run; the other sections belong to their owners and "
        "are kept as they are). Benchmarks live in `tests/bench/` and are not part of the "
        "test suite.\n\n"
    )
    body = "".join(f"## {title}\n\n{text.rstrip()}\n\n" for title, text in sections.items())
    body += "".join(f"## {title}\n{text.rstrip()}\n\n" for title, text in kept)
    return head + body.rstrip() + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--output",
        type=Path,
        default=DOC,
        help="the document to write (its plot goes to img/ beside it); default docs/benchmarks.md",
    )
    args = parser.parse_args(argv)
    doc: Path = args.output
    image = doc.parent / "img" / PLOT.name
    stream = _load("stream")
    if stream is not None and stream["cells"]:
        plot(stream, image)
    # Sections owned by others are kept from the real document, wherever this one goes.
    existing = DOC.read_text() if DOC.exists() else ""
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(render(existing))
    print(f"wrote {doc}" + (f" and {image}" if stream else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
