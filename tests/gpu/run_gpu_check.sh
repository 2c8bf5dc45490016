#!/usr/bin/env bash
# GPU check of the default engine through the worker (not run in CI): see gpu_check.py; with
# --vllm, then of a vLLM tensor-parallel engine through the worker: see vllm_check.py (needs
# vLLM 0.32.0 in that Python, or SIE_VLLM_COMMAND); with --sglang, of an SGLang one the same
# way (SGLang 0.5.23 in that Python, or SIE_SGLANG_COMMAND).
#
# Usage, from anywhere:  tests/gpu/run_gpu_check.sh [--vllm] [--sglang] [--allow-cpu] [--keep]
# Needs python3 (or $PYTHON) with torch (CUDA build) and transformers; no SGLang, no network.
# The worker's own small dependencies (starlette, uvicorn, httpx, jsonschema, PyYAML,
# prometheus-client, msgpack, psutil, nvidia-ml-py: NVML, for the device memory the worker
# places by) are imported from that Python, else installed offline from .whl/ in
# the repo (fill it on a machine with network: tests/gpu/run_gpu_check.sh --download-wheels,
# then carry .whl to the GPU machine).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

if [[ -n "${PYTHON:-}" ]]; then py="$PYTHON"
elif [[ -x .venv/bin/python ]]; then py=.venv/bin/python
else py=python3
fi
deps=(starlette uvicorn httpx jsonschema pyyaml prometheus-client anyio msgpack psutil nvidia-ml-py)

if [[ "${1:-}" == "--download-wheels" ]]; then
  # Versions from the lock where it pins them; wheels for the GPU machine's Python (3.12).
  pins=()
  for dep in "${deps[@]}"; do
    pin=$(grep -i -m1 "^${dep}==" requirements/dev.txt | cut -d' ' -f1 || true)
    pins+=("${pin:-$dep}")
  done
  exec "$py" -m pip download --dest .whl --only-binary=:all: --python-version "${WHEEL_PYTHON:-3.12}" \
    --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 "${pins[@]}"
fi

missing=$("$py" - <<'PY'
import importlib.util
names = {"starlette": "starlette", "uvicorn": "uvicorn", "httpx": "httpx",
         "jsonschema": "jsonschema", "yaml": "pyyaml", "prometheus_client": "prometheus-client",
         "anyio": "anyio", "msgpack": "msgpack", "psutil": "psutil", "pynvml": "nvidia-ml-py"}
print(" ".join(dist for mod, dist in names.items() if importlib.util.find_spec(mod) is None))
PY
)
if [[ -n "$missing" ]]; then
  [[ -d .whl ]] || { echo "FAIL: $py lacks $missing and there is no .whl/ to install from" >&2; exit 1; }
  target=$(mktemp -d)
  "$py" -m pip install --quiet --no-index --find-links .whl --target "$target" $missing
  export PYTHONPATH="$target${PYTHONPATH:+:$PYTHONPATH}"
fi
vllm=0 sglang=0 args=()
for arg in "$@"; do
  case "$arg" in
    --vllm) vllm=1 ;;
    --sglang) sglang=1 ;;
    *) args+=("$arg") ;;
  esac
done
status=0
"$py" tests/gpu/gpu_check.py "${args[@]}" || status=1
if ((vllm)); then
  echo
  "$py" tests/gpu/vllm_check.py "${args[@]}" || status=1
fi
if ((sglang)); then
  echo
  "$py" tests/gpu/vllm_check.py --engine sglang "${args[@]}" || status=1
fi
exit $status
