# The README's two commands (`make run`, `make test`) and the chores around them. Every
# target is idempotent; setup steps skip what their stamps say is already installed.
.DEFAULT_GOAL := help
.PHONY: help run test check docs bench soak setup setup-tools lock version image images clean-tools

BUNDLES := default sglang sglang-cu130 vllm llamacpp
IMAGE ?= ghcr.io/sie-workers/sie-worker
VERSION := $(shell cat VERSION)

help:
	@echo "make run          set up .venv, serve the quickstart model on :8080 (PORT)"
	@echo "make test         set up .venv, .venv-vllm, .venv-sglang and .tools (llama.cpp too), then run every check"
	@echo "make check        the inner loop: lint, types, chart, docs and every test that imports no"
	@echo "                  torch (no real model or engine) and starts no cluster, with the table of step times"
	@echo "make docs         serve the docs site on :8000 (DOCS_ADDR), rebuilt as pages change"
	@echo "make bench        run every benchmark, rewrite docs/benchmarks.md (~11 min, not a test)"
	@echo "make soak         the 10-minute soak of the worker; its figures go to docs/benchmarks.md"
	@echo "make setup        Python environment only (.venv, from requirements/*.txt)"
	@echo "make setup-tools  pinned tools only (.tools: chart tools, cluster control plane, SGLang parser)"
	@echo "make lock         regenerate requirements/*.txt (UPGRADE=1 to move to newer versions)"
	@echo "make version      write VERSION into the package and chart (V=x.y.z sets it first)"
	@echo "make image        build one image bundle with docker (BUNDLE=$(BUNDLES))"

# The quickstart needs the Python environment only: it serves from .venv and uses no chart
# tool. The tools (helm & co., the control plane) come with `make test` or `make setup-tools`.
run: setup
	scripts/run

# The real engines of `make test`: each has its scripts/setup-ENGINE and its "pytest ENGINE"
# step (the engines table of scripts/test). Adding one is a word here and a line there.
ENGINES := vllm sglang llamacpp

# The control plane (the longest build, needed only by the cluster suite) is built by
# scripts/test beside the pytest step rather than before it: on a fresh machine the two
# share the cores instead of taking turns.
# The engines' environments (downloads, mostly; llama.cpp's build is a compile, its binaries
# cached outside the checkout) are made beside the tools' builds (compiles, mostly); every
# one of them is skipped when its stamp matches.
test: setup
	pids=; for engine in $(ENGINES); do scripts/setup-$$engine & pids="$$pids $$!"; done; \
	  scripts/setup-tools --no-cluster; tools=$$?; \
	  for pid in $$pids; do wait $$pid || exit 1; done; exit $$tools
	scripts/test --build-cluster

# The inner loop: what `make test` runs less the real engines and the cluster suite (no
# engine environment, no control plane to build), with the same closing table of step times.
check: setup
	scripts/setup-tools --no-cluster
	scripts/test --check

# The docs site (mkdocs.yml, pages in docs/); make test builds it with --strict. The reference
# pages and pictures are generated: scripts/docs_reference.py, scripts/docs_pictures.py.
DOCS_ADDR ?= 127.0.0.1:8000
docs: setup
	NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs serve --dev-addr $(DOCS_ADDR)

# Benchmarks and the soak are measurements, not pass/fail tests: neither is part of `make test`.
bench: setup setup-tools
	tests/bench/run

soak: setup
	.venv/bin/python tests/reliability/soak.py

setup:
	scripts/setup

setup-tools: setup
	scripts/setup-tools

lock: setup
	scripts/lock $(if $(UPGRADE),--upgrade)

version:
	python3 scripts/version.py $(if $(V),--set $(V),--sync)

# Image tags: IMAGE:VERSION for default, IMAGE:VERSION-BUNDLE for the others, as the chart's
# workers.bundles.<bundle>.tagSuffix expects.
BUNDLE ?= default
image:
	docker build --target $(BUNDLE) \
	  --build-arg VERSION=$(VERSION) \
	  --build-arg REVISION=$(shell git rev-parse HEAD 2>/dev/null || echo unknown) \
	  -t $(IMAGE):$(VERSION)$(if $(filter default,$(BUNDLE)),,-$(BUNDLE)) .

images:
	@for b in $(BUNDLES); do $(MAKE) --no-print-directory image BUNDLE=$$b || exit 1; done

clean-tools:
	rm -rf .tools
