"""Worker footprint: resident memory of ``sie-worker serve`` and the modules it imports.

1. A real ``sie-worker serve`` (through ``_serve_probe.py``, which runs it unchanged and
   records ``sys.modules`` at exit) with the example model configs plus a fake-engine
   model, no engine running: RSS and USS (psutil) after start, then after ``--requests``
   API calls (probes, listings, metrics, OpenAPI, configs, refused requests); then with
   one engine loaded and ``--streams`` streams relayed (the worker process alone); then
   after unloading it.
2. Which of torch, transformers, sentence_transformers, sglang, numpy, safetensors the
   worker process imported (all its life), and the same for a script that imports
   ``sie_worker.worker.app`` and ``sie_worker.cli`` and creates the app.

Target: RSS <= 100 MB with no engines; none of torch, transformers or sglang imported.

    .venv/bin/python -m tests.bench.bench_footprint [--requests 2000] [--streams 200]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml

from tests.bench._bench import MODEL, OUT, ROOT, prepare, services, start_worker, write_result
from tests.bench._serve_probe import HEAVY
from tests.support import loopback
from tests.support.worker_fixtures import fake_model

__all__ = ["main"]

_LIMIT_MB = 100.0
_FORBIDDEN = ("torch", "transformers", "sglang")
_APP_PROBE = textwrap.dedent(
    """
    import json, os, sys, psutil
    import sie_worker.cli
    from sie_worker.worker.app import create_app
    from sie_worker.settings import Settings
    create_app(Settings.from_env(os.environ))
    heavy = sorted({m.split(".")[0] for m in sys.modules} & set(sys.argv[1].split(",")))
    rss = psutil.Process().memory_info().rss
    print(json.dumps({"heavy": heavy, "modules": len(sys.modules), "rss_mb": rss / 2**20}))
    """
)


def _memory(pid: int) -> dict[str, float]:
    info = psutil.Process(pid).memory_full_info()
    return {"rss_mb": info.rss / 2**20, "uss_mb": info.uss / 2**20}


def _api_calls(client: httpx.Client, count: int) -> dict[int, int]:
    calls: list[tuple[str, str, Any]] = [
        ("GET", "/healthz", None),
        ("GET", "/readyz", None),
        ("GET", "/v1/models", None),
        ("GET", "/v1/devices", None),
        ("GET", "/metrics", None),
        ("GET", "/openapi.json", None),
        ("GET", "/v1/configs", None),
        ("GET", f"/v1/models/{MODEL}", None),
        ("POST", "/v1/completions", {"model": "no/such-model", "prompt": "x"}),
        ("POST", "/v1/chat/completions", {"prompt": "no model field"}),
    ]
    statuses: dict[int, int] = {}
    for i in range(count):
        method, path, body = calls[i % len(calls)]
        status = client.request(method, path, json=body).status_code
        statuses[status] = statuses.get(status, 0) + 1
    return statuses


def _stream(client: httpx.Client, count: int) -> int:
    events = 0
    body = {
        "model": MODEL,
        "prompt": "a b c d",
        "stream": True,
        "fake": {"fast": True, "tokens": 64},
    }
    for _ in range(count):
        with client.stream("POST", "/v1/completions", json=body) as response:
            response.raise_for_status()
            events += sum(1 for line in response.iter_lines() if line.startswith("data:"))
    return events


def _app_probe() -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIE_")}
    env.update({"SIE_DEVICES": "cuda:0", "SIE_BUNDLE": "sglang", "HF_HUB_OFFLINE": "1"})
    done = subprocess.run(
        [sys.executable, "-c", _APP_PROBE, ",".join(HEAVY)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--streams", type=int, default=200)
    args = parser.parse_args(argv)
    prepare()
    config_dir = OUT / "footprint-configs"
    modules_file = OUT / "footprint-modules.json"
    modules_file.unlink(missing_ok=True)
    examples = [
        yaml.safe_load(p.read_text())
        for p in sorted((ROOT / "values-examples" / "models").glob("*.yaml"))
    ]
    probe = [sys.executable, str(Path(__file__).with_name("_serve_probe.py")), str(modules_file)]
    stages: dict[str, dict[str, float]] = {}
    with services() as running:
        worker = start_worker(
            "footprint-worker",
            config_dir,
            argv_prefix=probe,
            models=[fake_model(MODEL), *examples],
            env={"SIE_DEVICES": "cuda:0,cuda:1,cuda:2,cuda:3"},
        )
        running.append(worker)
        pid = worker.proc.pid
        with loopback.client(base_url=worker.url, timeout=60) as client:
            client.get("/readyz")
            stages["after start"] = _memory(pid)
            statuses = _api_calls(client, args.requests)
            stages[f"after {args.requests} API calls"] = _memory(pid)
            client.post(f"/v1/models/{MODEL}/load").raise_for_status()
            events = _stream(client, args.streams)
            stages[f"one engine loaded, {args.streams} streams relayed"] = _memory(pid)
            client.post(f"/v1/models/{MODEL}/unload").raise_for_status()
            stages["after unloading it"] = _memory(pid)
        mapped = sorted(
            {
                m.path
                for m in psutil.Process(pid).memory_maps()
                if any(h in m.path for h in _FORBIDDEN)
            }
        )
    serve_modules = json.loads(modules_file.read_text())
    app_modules = _app_probe()
    idle = [v["rss_mb"] for k, v in stages.items() if "engine loaded" not in k]
    forbidden = sorted(set(serve_modules["heavy"] + app_modules["heavy"]) & set(_FORBIDDEN))
    result = {
        "command": "python -m tests.bench.bench_footprint " + " ".join(argv or sys.argv[1:]),
        "configs": 1 + len(examples),
        "devices": 4,
        "stages": stages,
        "api_statuses": {str(k): v for k, v in sorted(statuses.items())},
        "stream_events": events,
        "serve_process": serve_modules,
        "serve_mapped_heavy_files": mapped,
        "app_import_probe": app_modules,
        "targets": [
            {
                "name": "worker RSS with no engines",
                "limit_mb": _LIMIT_MB,
                "value_mb": max(idle),
                "met": max(idle) <= _LIMIT_MB,
            },
            {
                "name": "no torch / transformers / sglang in the worker",
                "value": forbidden,
                "met": not forbidden and not mapped,
            },
        ],
    }
    write_result("footprint", result)
    for stage, memory in stages.items():
        print(f"{stage}: RSS {memory['rss_mb']:.1f} MB, USS {memory['uss_mb']:.1f} MB")
    print(f"serve process imported: {serve_modules}; app probe: {app_modules}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
