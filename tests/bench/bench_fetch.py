"""Weights: ``sie-worker fetch`` from a hub endpoint vs a plain file copy of the same bytes.

A model folder of ``--size-mib`` MiB in ``--shards`` safetensors shards (random bytes, plus
config and tokenizer files; kept in ``tests/bench/out/fetch-src`` between runs) is served
by the fake hub (:mod:`tests.support.fake_hub`, its own process, ``sendfile`` from the page
cache) and fetched into an empty ``HF_HOME`` by ``sie-worker fetch`` (a fresh process, as
the prefetch init container runs it); the baseline copies the same folder with
``cp -r --reflink=never`` (what a user copying weights from a volume runs; the kernel moves
the bytes). A second baseline copies them through user space as any Python download must
(``shutil.copyfileobj``, 1 MiB buffers). All read the source from the page cache and write
the same bytes to the same disk; each measurement starts after ``sync``, and they take
turns, ``--rounds`` times. The figures are the median throughputs and the ratio of fetch to
``cp``. Target: fetch >= 80% of the copy.

    .venv/bin/python -m tests.bench.bench_fetch [--size-mib 2048] [--shards 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.bench._bench import OUT, ROOT, write_result

__all__ = ["main", "section"]

_TARGET = 0.8
_REPO = "bench/weights"
_MIB = 1 << 20
_PYCOPY = """
import shutil, sys
from pathlib import Path
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
dst.mkdir()
for f in sorted(src.iterdir()):
    with f.open("rb") as a, (dst / f.name).open("wb") as b:
        shutil.copyfileobj(a, b, 1 << 20)
"""


def _source(size_mib: int, shards: int) -> Path:
    src = OUT / "fetch-src"
    per = size_mib * _MIB // shards
    names = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    if (
        src.is_dir()
        and sorted(p.name for p in src.glob("*.safetensors")) == names
        and all((src / n).stat().st_size == per for n in names)
    ):
        return src
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    for name in names:
        with (src / name).open("wb") as out:
            for _ in range(per // _MIB):
                out.write(os.urandom(_MIB))
    (src / "config.json").write_text('{"num_attention_heads": 8, "num_key_value_heads": 8}')
    (src / "tokenizer.json").write_text('{"version": "1.0"}')
    weight_map = {f"w{i}": n for i, n in enumerate(names)}
    (src / "model.safetensors.index.json").write_text(
        '{"metadata": {}, "weight_map": ' + str(weight_map).replace("'", '"') + "}"
    )
    return src


def _timed(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, float, str]:
    """Wall seconds, CPU seconds of the child, and its output."""
    subprocess.run(["sync"], check=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{argv[0]} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, cpu, done.stdout


def _hub(src: Path) -> tuple[subprocess.Popen[str], str]:
    hub = subprocess.Popen(
        [sys.executable, "-m", "tests.support.fake_hub", str(src), _REPO],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert hub.stdout is not None
    url = hub.stdout.readline().strip()  # after it has hashed the files
    if not url.startswith("http"):
        hub.kill()
        raise SystemExit("the fake hub did not start")
    return hub, url


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--size-mib", type=int, default=2048)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    src = _source(args.size_mib, args.shards)
    total = sum(p.stat().st_size for p in src.iterdir())
    work = OUT / "fetch-work"
    shutil.rmtree(work, ignore_errors=True)
    (work / "configs").mkdir(parents=True)
    (work / "configs" / "bench.yaml").write_text(
        f"sie_id: {_REPO}\nhf_id: {_REPO}\ntasks: {{generate: {{}}}}\nprofiles: {{default: {{}}}}\n"
    )
    hub, url = _hub(src)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "SIE_"))}
    env.update({"HF_ENDPOINT": url, "HF_HOME": str(work / "hf"), "TRANSFORMERS_OFFLINE": ""})
    fetch_argv = [str(Path(sys.executable).with_name("sie-worker")), "fetch", "--no-progress"]
    copies: list[float] = []
    pycopies: list[float] = []
    fetches: list[float] = []
    downloads: list[float] = []
    fetch_cpu: list[float] = []
    try:
        for i in range(args.rounds):
            order = ("copy", "pycopy", "fetch") if i % 2 == 0 else ("fetch", "pycopy", "copy")
            for kind in order:
                if kind == "pycopy":
                    wall, _, _ = _timed(
                        [sys.executable, "-c", _PYCOPY, str(src), str(work / "copy")]
                    )
                    pycopies.append(wall)
                    shutil.rmtree(work / "copy")
                elif kind == "copy":
                    wall, _, _ = _timed(
                        ["cp", "-r", "--reflink=never", str(src), str(work / "copy")]
                    )
                    copies.append(wall)
                    shutil.rmtree(work / "copy")
                else:
                    wall, cpu, out = _timed([*fetch_argv, str(work / "configs")], env)
                    fetches.append(wall)
                    fetch_cpu.append(cpu)
                    found = re.search(r"downloaded [0-9.]+ GB in ([0-9.]+) s", out)
                    downloads.append(float(found.group(1)) if found else wall)
                    shutil.rmtree(work / "hf")
                print(f"round {i + 1} {kind}: {wall:.2f} s ({total / wall / 1e6:.0f} MB/s)")
    finally:
        hub.terminate()
        hub.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    copy_rate = total / statistics.median(copies)
    pycopy_rate = total / statistics.median(pycopies)
    fetch_rate = total / statistics.median(fetches)
    download_rate = total / statistics.median(downloads)
    ratio = fetch_rate / copy_rate
    result = {
        "command": "python -m tests.bench.bench_fetch " + " ".join(argv or sys.argv[1:]),
        "bytes": total,
        "shards": args.shards,
        "rounds": args.rounds,
        "copy_seconds": copies,
        "pycopy_seconds": pycopies,
        "pycopy_mb_s": pycopy_rate / 1e6,
        "fetch_seconds": fetches,
        "download_seconds": downloads,
        "fetch_cpu_seconds": fetch_cpu,
        "copy_mb_s": copy_rate / 1e6,
        "fetch_mb_s": fetch_rate / 1e6,
        "download_mb_s": download_rate / 1e6,
        "target": {
            "name": "fetch / copy",
            "floor": _TARGET,
            "value": ratio,
            "met": ratio >= _TARGET,
        },
        "loadavg": os.getloadavg()[0],
    }
    write_result("fetch", result)
    print(
        f"{total / 1e9:.2f} GB: cp {copy_rate / 1e6:.0f} MB/s, Python copy "
        f"{pycopy_rate / 1e6:.0f} MB/s, fetch {fetch_rate / 1e6:.0f} MB/s "
        f"({download_rate / 1e6:.0f} MB/s without the process start) = {ratio:.0%} of the copy"
    )
    return 0


def section(result: dict[str, Any]) -> str:
    """Section 6 of docs/benchmarks.md."""
    t = result["target"]
    rounds = zip(
        result["copy_seconds"],
        result["pycopy_seconds"],
        result["fetch_seconds"],
        result["download_seconds"],
        strict=True,
    )
    rows = "\n".join(
        f"| {i + 1} | {c:.2f} | {p:.2f} | {f:.2f} | {d:.2f} |"
        for i, (c, p, f, d) in enumerate(rounds)
    )
    return (
        f"`{result['command'].strip()}`: {result['bytes'] / 1e9:.2f} GB in {result['shards']} "
        "shards, served by the fake hub (plain HTTP, `sendfile` from the page cache) and fetched "
        "by `sie-worker fetch` into an empty `HF_HOME`, against `cp -r --reflink=never` of the "
        "same folder and a user-space Python copy, taking turns, "
        f"{result['rounds']} rounds (load average {result['loadavg']:.1f} at the end).\n\n"
        "| round | cp s | Python copy s | fetch s | fetch, download only s |\n"
        "|---:|---:|---:|---:|---:|\n"
        f"{rows}\n\n"
        f"Medians: cp {result['copy_mb_s']:.0f} MB/s, Python copy {result['pycopy_mb_s']:.0f} "
        f"MB/s, fetch {result['fetch_mb_s']:.0f} MB/s ({result['download_mb_s']:.0f} MB/s "
        f"without the process start): fetch / cp = **{t['value']:.0%}** (target >= "
        f"{t['floor']:.0%}: {'met' if t['met'] else 'not met'}).\n"
    )


if __name__ == "__main__":
    sys.exit(main())
