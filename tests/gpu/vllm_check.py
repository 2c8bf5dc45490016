"""GPU check of vLLM (or, with ``--engine sglang``, SGLang) through the worker (not run in
CI; needs CUDA GPUs and vLLM 0.32.0, or SGLang 0.5.23).

Starts ``python -m sie_worker serve`` with ``SIE_BUNDLE=vllm`` (``sglang-cu130``) on the
machine's GPUs (two when there are, else one) and, through its HTTP API, checks that:

- a tiny random Llama (built here, heads 32 wide) loads as one engine at the width of the
  devices: the worker's plan (``--tensor-parallel-size``/``--tp-size``, the memory flag) is in
  the engine's command line, and it has one rank process (``VLLM::Worker_TP<i>``,
  ``sglang::scheduler_TP<i>``) per device;
- it answers ``/v1/completions`` and a streamed ``/v1/chat/completions`` (shape only: bf16
  random weights);
- the engine's own series (``vllm:*``, ``sglang:*``) pass through the worker's ``/metrics``;
- unloading it leaves no process of its group and none of its ``/dev/shm`` files;
- with ``--pp`` (two GPUs): PP=2 on one worker, and PP=2 across two workers as a group of
  nodes on loopback (:mod:`tests.gpu.vllm_pp_check`).

The engine is the machine's Python's (``python -m vllm.entrypoints.openai.api_server``,
``python -m sglang.launch_server``), or the ``SIE_VLLM_COMMAND``/``SIE_SGLANG_COMMAND`` given.
Without it the check reports one FAIL saying so. ``--allow-cpu`` runs the same checks on
``cpu:0,cpu:1`` with the command pointing at the tests' CPU engines (to test this script
without a GPU: ``SIE_VLLM_COMMAND=".venv-vllm/bin/python -m vllm.entrypoints.openai.api_server"
tests/gpu/run_gpu_check.sh --vllm --allow-cpu``, or ``SIE_SGLANG_COMMAND=".venv-sglang/bin/python
-m sglang.launch_server" tests/gpu/run_gpu_check.sh --sglang --allow-cpu``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "worker" / "src")]

from tests.gpu.gpu_check import _expect, _raise, check, free_port, http, summary  # noqa: E402

MODEL = "gpu-check/tiny-llama-vllm"
VLLM = "sie_server.adapters.vllm.generation:VLLMGenerationAdapter"
SHM = Path("/dev/shm")


@dataclass(frozen=True)
class Engine:
    """What differs between the engines this script checks."""

    name: str
    module: str  # python -m <module>
    bundle: str
    variable: str  # SIE_*_COMMAND
    adapter: str
    width_flag: str
    memory_flag: str
    ranks: str  # the title prefix of its rank processes
    series: str  # its metrics' prefix
    release: str
    loadtime: dict[str, Any] = field(default_factory=dict)
    args: tuple[str, ...] = ()


ENGINES = {
    "vllm": Engine(
        "vLLM", "vllm.entrypoints.openai.api_server", "vllm", "SIE_VLLM_COMMAND", VLLM,
        "--tensor-parallel-size", "--gpu-memory-utilization", "VLLM::Worker_TP", "vllm:",
        "0.32.0", {"gpu_memory_utilization": 0.2, "enforce_eager": True},
        ("--max-num-seqs", "4"),
    ),
    "sglang": Engine(
        "SGLang", "sglang.launch_server", "sglang-cu130", "SIE_SGLANG_COMMAND",
        "sie_server.adapters.sglang.cuda13:SGLangCuda13Adapter", "--tp-size",
        "--mem-fraction-static", "sglang::scheduler_TP", "sglang:", "0.5.23",
        {"mem_fraction_static": 0.2},
    ),
}  # fmt: skip


def _group(pgid: int) -> list[tuple[int, str]]:
    """(pid, first argv word) of every live process of group ``pgid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            fields = stat[stat.rfind(")") + 2 :].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                title = (entry / "cmdline").read_bytes().split(b"\0")[0].decode()
                found.append((int(entry.name), title))
    return found


def _engine(model: str, module: str = ENGINES["vllm"].module) -> tuple[int, list[str]]:
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError):
            argv = (entry / "cmdline").read_bytes().decode().split("\0")
            if module in " ".join(argv) and model in argv:
                return int(entry.name), argv
    raise AssertionError(f"no {module} serves {model}")


def _shm_of(pids: list[int]) -> set[Path]:
    found: set[Path] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and fields[5].startswith(f"{SHM}/"):
                    found.add(Path(fields[5].removesuffix(" (deleted)")))
    return found


def _write_config(
    directory: Path,
    llama: Path,
    width: int,
    stages: int = 1,
    engine: Engine = ENGINES["vllm"],
    precision: str = "bfloat16",
    **loadtime: Any,
) -> None:
    config = {
        "sie_id": MODEL,
        "model_path": str(llama),
        "max_sequence_length": 256,
        "tasks": {"generate": {}},
        "profiles": {
            "default": {
                "adapter_path": engine.adapter,
                "compute_precision": precision,
                "extra_launch_args": list(engine.args),
                "adapter_options": {
                    "loadtime": {
                        "tensor_parallel_size": width,
                        "pipeline_parallel_size": stages,
                        **engine.loadtime,
                        "startup_timeout_s": 600,
                        "request_read_timeout_s": 300,
                        **loadtime,
                    }
                },
            }
        },
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tiny-llama-vllm.yaml").write_text(json.dumps(config, indent=2))


def _start_worker(
    configs: Path,
    devices: str,
    command: str,
    log: Path,
    extra: dict[str, str] | None = None,
    port: int | None = None,
    engine: Engine = ENGINES["vllm"],
) -> tuple[Any, str]:
    port = port or free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SIE_", "CUDA_VISIBLE"))}
    path = os.pathsep.join([str(ROOT / "worker" / "src"), str(ROOT), env.get("PYTHONPATH", "")])
    env[engine.variable] = command
    env.update(
        SIE_DEVICES=devices,
        SIE_BUNDLE=engine.bundle,
        SIE_MODEL_READY_TIMEOUT_S="900",
        HF_HUB_OFFLINE="1",
        PYTHONUNBUFFERED="1",
        PYTHONPATH=path.rstrip(os.pathsep),
    )
    env.update(extra or {})
    argv = [sys.executable, "-m", "sie_worker", "serve", "--config-dir", str(configs)]
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*argv, "--port", str(port)], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"worker exited with {process.returncode}; see {log}")
        with contextlib.suppress(OSError):
            http("GET", url + "/healthz", timeout=2)
            return process, url
        time.sleep(0.2)
    raise RuntimeError(f"worker not healthy within 120s; see {log}")


def _checks(url: str, devices: list[str], engine: Engine) -> None:
    width = len(devices)
    state: dict[str, Any] = {}

    def load() -> str:
        entry = http("POST", f"{url}/v1/models/{MODEL}/load", {}, timeout=900)
        _expect(entry["state"] == "ready", f"state {entry['state']}: {entry.get('error')}")
        _expect(entry["devices"] == devices, f"devices {entry['devices']}")
        pid, argv = _engine(MODEL, engine.module)
        state["pid"] = pid
        tp = argv[argv.index(engine.width_flag) + 1]
        memory = argv[argv.index(engine.memory_flag) + 1]
        _expect(tp == str(width), f"{engine.width_flag} {tp}")
        return f"pid {pid}, {engine.width_flag} {tp}, {engine.memory_flag} {memory}"

    def ranks() -> str:
        group = _group(state["pid"])
        state["group"] = [pid for pid, _ in group]
        state["shm"] = _shm_of(state["group"])
        titles = sorted(t for _, t in group if t.startswith(engine.ranks))
        _expect(len(titles) == width, f"rank processes {titles}")
        return f"{titles}; {len(state['shm'])} file(s) in /dev/shm"

    def complete() -> str:
        body = {"model": MODEL, "prompt": "Hello", "max_tokens": 8, "ignore_eos": True}
        answer = http("POST", f"{url}/v1/completions", body)
        usage = answer["usage"]["completion_tokens"]
        _expect(usage == 8, f"completion tokens {usage}")
        return f"8 tokens: {answer['choices'][0]['text']!r}"

    def stream() -> str:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 5, "stream": True, "ignore_eos": True}  # fmt: skip
        events = http("POST", f"{url}/v1/chat/completions", body)
        _expect(events[-1] == "[DONE]", f"last event {events[-1]!r}")
        last = json.loads(events[-2])["choices"][0]["finish_reason"]
        _expect(last == "length", f"finish_reason {last}")
        return f"{len(events) - 1} events, then [DONE]"

    def metrics() -> str:
        import urllib.request

        with urllib.request.urlopen(url + "/metrics", timeout=30) as response:
            text = response.read().decode()
        lines = [line for line in text.splitlines() if line.startswith(engine.series)]
        _expect(any(f'model="{MODEL}"' in line for line in lines), f"no {engine.series}* series")
        return f"{len(lines)} {engine.series}* samples"

    def unload() -> str:
        http("POST", f"{url}/v1/models/{MODEL}/unload", {}, timeout=300)
        left = [pid for pid, _ in _group(state["pid"])]  # live ones (zombies are gone)
        files = [str(f) for f in state.get("shm", set()) if f.exists()]
        _expect(not left and not files, f"processes {left}, files {files}")
        return "no process, no /dev/shm file left"

    for name, step in (
        (f"a width-{width} {engine.name} engine loads on {','.join(devices)}", load),
        ("one rank process per device", ranks),
        ("/v1/completions through the worker", complete),
        ("streamed /v1/chat/completions through the worker", stream),
        (f"{engine.series}* series on the worker's /metrics", metrics),
        ("unload leaves nothing of the engine", unload),
    ):
        if not check(name, step):
            break


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--allow-cpu", action="store_true", help="run on cpu:0,cpu:1")
    parser.add_argument("--keep", action="store_true", help="keep the work folder and logs")
    parser.add_argument(
        "--pp", action="store_true", help="also pipeline parallelism (needs two GPUs; vLLM)"
    )
    parser.add_argument("--engine", choices=sorted(ENGINES), default="vllm")
    args = parser.parse_args()
    engine = ENGINES[args.engine]
    command = os.environ.get(engine.variable) or shlex.join([sys.executable, "-m", engine.module])
    top = engine.module.split(".", 1)[0]
    if engine.variable not in os.environ and importlib.util.find_spec(top) is None:
        missing = f"{sys.executable} has no {top} ({engine.release})"
        check(f"{engine.name} is installed", lambda: _raise(missing))
        return summary()
    gpus = 0
    if shutil.which("nvidia-smi"):
        listed = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        gpus = len([line for line in listed.splitlines() if line.strip()])
    if gpus == 0 and not args.allow_cpu:
        check("a CUDA device is visible", lambda: _raise("no GPU (nvidia-smi)"))
        return summary()
    devices = [f"cuda:{i}" for i in range(min(gpus, 2))] if gpus else ["cpu:0", "cpu:1"]
    work = Path(tempfile.mkdtemp(prefix=f"sie-{args.engine}-check-"))
    worker = None
    try:
        from tests.support.tiny_models import build_tiny_llama

        llama = build_tiny_llama(work / "tiny-llama", head_dim=32)
        # SGLang's CPU kernels for 16-bit types need AMX: float32 on cpu devices.
        precision = "float32" if not gpus and args.engine == "sglang" else "bfloat16"
        _write_config(work / "configs", llama, len(devices), engine=engine, precision=precision)
        worker, url = _start_worker(
            work / "configs", ",".join(devices), command, work / "w.log", engine=engine
        )
        _checks(url, devices, engine)
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=120)
        check("worker exits 0 on SIGTERM", lambda: _expect(code == 0, f"exit {code}"))
        if args.pp and args.engine == "vllm":
            from tests.gpu.vllm_pp_check import pipeline_checks

            pipeline_checks(llama, devices, command, work)
    except Exception:
        traceback.print_exc()
        check("setup", lambda: _raise("see the traceback above"))
    finally:
        if worker is not None and worker.poll() is None:
            worker.kill()
        log = work / "w.log"
        if not all(ok for _, ok, _ in _results()) and log.exists():
            print("---- last worker log lines ----")
            print("\n".join(log.read_text(errors="replace").splitlines()[-60:]))
        if args.keep:
            print(f"work folder kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return summary()


def _results() -> list[tuple[str, bool, str]]:
    from tests.gpu import gpu_check

    return gpu_check._results


if __name__ == "__main__":
    sys.exit(main())
