"""Chart render time: ``helm template`` of a release with 20 pools x 2 bundles.

The values file (written to ``tests/bench/out/chart-values-20x2.yaml``) enables 20 pools,
alternating one-GPU pools (``gpu.count: 1``), four one-GPU workers per pod
(``gpu.count: 4``) and device groups (``gpu.count: 4`` or ``8``, ``deviceGroup: true``),
each with two bundles, plus the example model configs, autoscaling, a ServiceMonitor and
an API key Secret. Each render is a fresh ``helm template`` process (what CI and users
run); the median of ``--runs`` renders is the figure. Target: median <= 2 s.

    .venv/bin/python -m tests.bench.bench_chart [--runs 7]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.bench._bench import OUT, ROOT, summary, write_result

__all__ = ["main", "values"]

_TARGET_S = 2.0
_BUNDLE_PAIRS = (("default", "sglang"), ("sglang", "sglang-cu130"))
_SHAPES: tuple[dict[str, Any], ...] = (
    {"count": 1},
    {"count": 4},
    {"count": 4, "deviceGroup": True},
    {"count": 8, "deviceGroup": True},
)


def _helm() -> str:
    local = ROOT / ".tools" / "bin" / "helm"
    found = str(local) if local.exists() else shutil.which("helm")
    if not found:
        raise SystemExit("helm not found: run scripts/setup-tools (it unpacks .tools/bin/helm)")
    return found


def values(pools: int = 20) -> dict[str, Any]:
    models = {}
    for path in sorted((ROOT / "values-examples" / "models").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        models[path.stem] = doc
    pool_values: dict[str, Any] = {}
    for i in range(pools):
        gpu = dict(_SHAPES[i % len(_SHAPES)])
        first, second = _BUNDLE_PAIRS[i % len(_BUNDLE_PAIRS)]
        group = gpu.get("deviceGroup", False)
        pool: dict[str, Any] = {
            "enabled": True,
            "machineProfile": f"bench-{i}",
            "gpuType": "l4" if i % 2 else "h100",
            "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-L4" if i % 2 else "NVIDIA-H100"},
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            ],
            "gpu": gpu,
            "bundles": {
                first: {"minReplicas": 1, "maxReplicas": 4},
                second: {"minReplicas": 0, "maxReplicas": 2},
            },
        }
        if group:
            pool["shmSize"] = f"{8 * gpu['count']}Gi"
            pool["resources"] = {
                "requests": {"cpu": str(4 * gpu["count"]), "memory": f"{16 * gpu['count']}Gi"},
                "limits": {"cpu": str(8 * gpu["count"]), "memory": f"{32 * gpu['count']}Gi"},
            }
        pool_values[f"pool-{i:02d}"] = pool
    return {
        "workers": {
            "common": {
                "apiKey": {"secretName": "sie-api-key", "key": "api-key"},
                "generateReadTimeoutSec": 600,
                # The example 32B model declares a 1200 s startup: give it the budget.
                "modelReadyTimeoutSec": 1800,
                "probes": {"liveness": {"periodSeconds": 20, "failureThreshold": 96}},
            },
            "pools": {"l4": {"enabled": False}, **pool_values},  # the chart's default pool off
        },
        "models": models,
        "autoscaling": {"enabled": True},
        "serviceMonitor": {"enabled": True},
    }


def _render(helm: str, values_file: Path) -> tuple[float, float, str]:
    """Wall seconds, CPU seconds (user + system of helm) and the rendered manifests."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(
        [helm, "template", "sie", str(ROOT / "chart"), "-f", str(values_file)],
        capture_output=True,
        text=True,
        env={**os.environ, "HELM_CACHE_HOME": str(OUT / "helm-cache")},
        check=False,
    )
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    if done.returncode != 0:
        raise SystemExit(f"helm template failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return elapsed, cpu, done.stdout


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--pools", type=int, default=20)
    args = parser.parse_args(argv)
    helm = _helm()
    OUT.mkdir(parents=True, exist_ok=True)
    values_file = OUT / f"chart-values-{args.pools}x2.yaml"
    values_file.write_text(yaml.safe_dump(values(args.pools), sort_keys=False))
    version = subprocess.run(
        [helm, "version", "--short"], capture_output=True, text=True, check=True
    ).stdout.strip()
    _render(helm, values_file)  # warm the page cache; not counted
    times: list[float] = []
    cpu: list[float] = []
    output = ""
    for _ in range(args.runs):
        elapsed, used, output = _render(helm, values_file)
        times.append(elapsed)
        cpu.append(used)
    kinds: dict[str, int] = {}
    for doc in yaml.safe_load_all(output):
        if isinstance(doc, dict):
            kinds[doc["kind"]] = kinds.get(doc["kind"], 0) + 1
    median = statistics.median(times)
    result = {
        "command": "python -m tests.bench.bench_chart " + " ".join(argv or sys.argv[1:]),
        "helm": version,
        "pools": args.pools,
        "bundles_per_pool": 2,
        "documents": sum(kinds.values()),
        "kinds": kinds,
        "output_bytes": len(output),
        "seconds": {**summary(times), "median": median},
        "cpu_seconds": {**summary(cpu), "median": statistics.median(cpu)},
        "target": {
            "name": "helm template median",
            "limit_s": _TARGET_S,
            "value_s": median,
            "met": median <= _TARGET_S,
        },
    }
    write_result("chart", result)
    print(
        f"helm template, {args.pools} pools x 2 bundles: {sum(kinds.values())} documents, "
        f"median {median:.3f} s over {args.runs} runs (min {min(times):.3f}, max {max(times):.3f}; "
        f"helm CPU median {statistics.median(cpu):.3f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
