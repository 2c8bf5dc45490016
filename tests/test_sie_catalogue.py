"""SIE 0.10.1's own model catalogue (213 configs in the ``sie-server`` wheel), as users bring it.

Every config passes ``sie-worker validate``; every SGLang profile (``<sie_id>`` and
``<sie_id>:<profile>``) gets a ``sie-worker plan`` on 8 devices with the bundle that serves
its adapter, and SGLang's own parser of that bundle's release accepts every argv (one parser
run per release); the two multi-GPU models plan on their block; and mutations of the real
configs keep seed 000's refusals. The wheel comes from PyPI (:mod:`tests.support.sie_wheel`);
without a reachable registry these tests skip.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib.util
import io
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sie_worker.cli import main
from sie_worker.config.adapters import canonical_path, resolve_adapter
from sie_worker.config.files.jsonpath import json_path
from sie_worker.config.files.reader import parse_config
from sie_worker.config.flags.option_tables import option_tables, resolve
from sie_worker.config.flags.reserved_flags import RESERVED_DESTS
from sie_worker.config.load.loadtime import resolve_load_options
from sie_worker.config.model import served_model, served_models
from sie_worker.engines.sglang.release import BUNDLE_VERSIONS, PINNED_VERSION
from sie_worker.errors import InvalidConfig
from sie_worker.settings import Settings
from sie_worker.worker.launcher.plan import plan_launch

from tests.support import sglang_parser
from tests.support.ci import missing
from tests.support.config_strategies import json_values, mutated
from tests.support.sie_wheel import catalogue_dir

ROOT = Path(__file__).resolve().parents[1]
OLD_PATH = Path(os.environ.get("SIE_SGLANG_OLD_PATH", ROOT / ".tools" / "sglang-0.5.10"))
EIGHT = ",".join(f"cuda:{i}" for i in range(8))
SGLANG_MODULE = "sie_server.adapters.sglang."


@pytest.fixture(scope="module")
def catalogue() -> Path:
    return catalogue_dir()


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for key in list(os.environ):
        if key.startswith("SIE_") and key != "SIE_SGLANG_OLD_PATH":
            monkeypatch.delenv(key)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))


@functools.cache
def _docs(catalogue: Path) -> dict[str, dict[str, Any]]:
    """The catalogue's documents by file name (read once; copy one before changing it)."""
    return {
        p.name: yaml.safe_load(p.read_text(encoding="utf-8"))
        for p in sorted(catalogue.glob("*.yaml"))
    }


def _adapter_of(profiles: dict[str, Any], name: str) -> str | None:
    """The adapter_path a profile ends up with, read from the YAML (extends followed)."""
    seen: set[str] = set()
    current: str | None = name
    while current is not None and current not in seen:
        seen.add(current)
        profile = profiles[current] or {}
        if profile.get("adapter_path"):
            return canonical_path(str(profile["adapter_path"]))
        current = profile.get("extends")
    return None


def _sglang_profiles(catalogue: Path) -> list[tuple[str, str, str]]:
    """``(file, profile, adapter_path)`` of every profile on one of SIE's SGLang adapters that
    this image runs (SIE's vision-extract adapter is served by none of its bundles)."""
    found = []
    for file, doc in _docs(catalogue).items():
        for name in doc["profiles"]:
            adapter = _adapter_of(doc["profiles"], name)
            if adapter and adapter.startswith(SGLANG_MODULE):
                found.append((file, name, adapter))
    return found


# --- validate ------------------------------------------------------------------------------


def test_every_catalogue_config_passes_validate(
    catalogue: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = sorted(catalogue.glob("*.yaml"))
    assert len(files) == 213, "sie-server 0.10.1 ships 213 model configs"
    assert main(["validate", str(catalogue)]) == 0
    captured = capsys.readouterr()
    assert captured.out == ""
    counted = sum(int(line.split(": ", 1)[1].split()[0]) for line in captured.err.splitlines())
    assert counted == len(files)
    assert "invalid" not in captured.err
    assert (
        "not served by this image (adapter: files): sie_server_rust.adapters.candle" in captured.err
    )


def test_validate_never_rewrites_a_catalogue_file(catalogue: Path) -> None:
    before = {p: p.read_bytes() for p in catalogue.glob("*.yaml")}
    assert main(["validate", str(catalogue)]) == 0
    assert {p: p.read_bytes() for p in before} == before


# --- plan, and SGLang's parsers ---------------------------------------------------------------


def _plan(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, path: Path, profile: str,
    bundle: str, devices: str = EIGHT,
) -> dict[str, Any]:  # fmt: skip
    monkeypatch.setenv("SIE_BUNDLE", bundle)
    code = main(["plan", str(path), "--profile", profile, "--devices", devices])
    out = capsys.readouterr().out
    assert code == 0, f"{path.name}:{profile} [{bundle}]: {out}"
    result: dict[str, Any] = json.loads(out)
    return result


@pytest.fixture(scope="module")
def plans(catalogue: Path) -> list[tuple[str, str, str, dict[str, Any]]]:
    """``(file, profile, bundle, plan)`` of every SGLang profile, planned on 8 devices with
    its adapter's bundle (the plan CLI, as a user runs it)."""
    found = []
    with pytest.MonkeyPatch.context() as monkeypatch:
        for file, name, adapter in _sglang_profiles(catalogue):
            bundle = resolve_adapter(adapter).bundle
            monkeypatch.setenv("SIE_BUNDLE", bundle)
            out = io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
                code = main(["plan", str(catalogue / file), "--profile", name, "--devices", EIGHT])
            assert code == 0, f"{file}:{name} [{bundle}]: {out.getvalue()}"
            found.append((file, name, bundle, json.loads(out.getvalue())))
    return found


def test_every_sglang_profile_plans_with_the_bundle_of_its_adapter(
    catalogue: Path, plans: list[tuple[str, str, str, dict[str, Any]]]
) -> None:
    expected = {(f, p) for f, p, _ in _sglang_profiles(catalogue)}
    assert {(f, p) for f, p, _, _ in plans} == expected
    docs = _docs(catalogue)
    for file, name, bundle, plan in plans:
        sie_id = docs[file]["sie_id"]
        assert plan["model"] == (sie_id if name == "default" else f"{sie_id}:{name}")
        adapter = _adapter_of(docs[file]["profiles"], name)
        assert adapter is not None
        cu130 = adapter.split(":")[0].rsplit(".", 1)[1] in ("gemma", "cuda13")
        assert bundle == ("sglang-cu130" if cu130 else "sglang"), (file, name)
        argv = plan["argv"]
        assert argv[1:3] == ["-m", "sglang.launch_server"]
        assert "None" not in argv, f"{file}:{name}: a value printed as None"


def _run_parser(python_path: Path | None, argvs: list[list[str]]) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = sglang_parser.parse({"argvs": argvs}, python_path)["argvs"]
    return results


@pytest.mark.torch  # SGLang's own parser, torch imported with it
@pytest.mark.parametrize("bundle", sorted(BUNDLE_VERSIONS))
def test_sglang_of_the_bundle_accepts_every_planned_argv(
    bundle: str, plans: list[tuple[str, str, str, dict[str, Any]]]
) -> None:
    release = BUNDLE_VERSIONS[bundle]
    if release == PINNED_VERSION:
        if importlib.util.find_spec("sglang") is None:
            missing(f"no SGLang {release} in the venv: scripts/setup installs it")
        path = None
    else:
        if not (OLD_PATH / "sglang").is_dir():
            missing(f"no SGLang {release} parser at {OLD_PATH}: scripts/setup-tools installs it")
        path = OLD_PATH
    cases = [(f"{f}:{p}", plan["argv"][3:]) for f, p, b, plan in plans if b == bundle]
    assert cases, f"no catalogue profile runs on {bundle}"
    results = _run_parser(path, [argv for _, argv in cases])
    refused = [
        f"{name}: {result['error']}\n    {' '.join(argv)}"
        for (name, argv), result in zip(cases, results, strict=True)
        if not result["ok"]
    ]
    assert not refused, "\n".join(refused)
    for (name, argv), result in zip(cases, results, strict=True):
        values = result["values"]
        tp = values.get("tp_size", values.get("tensor_parallel_size"))
        assert tp == int(argv[argv.index("--tp-size") + 1]), name


def test_the_multi_gpu_models_plan_on_their_block(
    catalogue: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for file, profile, width in [
        ("Qwen__Qwen3.5-122B-A10B-FP8.yaml", "default", 2),
        ("Qwen__Qwen3.5-122B-A10B-FP8.yaml", "no-spec", 2),
        ("zai-org__GLM-5.3-Flash.yaml", "default", 8),
    ]:
        plan = _plan(capsys, monkeypatch, catalogue / file, profile, "sglang-cu130")
        argv = plan["argv"]
        assert plan["width"] == width
        assert argv[argv.index("--tp-size") + 1] == str(width)
        assert plan["devices"] == [f"cuda:{i}" for i in range(width)]
        assert plan["env"]["CUDA_VISIBLE_DEVICES"] == ",".join(str(i) for i in range(width))
        assert "--nccl-port" in argv
        assert "--disable-prefill-cuda-graph" in argv
    # The width-2 model's two profiles each claim a block: on 4 devices the second plan
    # would go to cuda:2,cuda:3 in a worker holding the first (placement is the manager's).
    plan = _plan(
        capsys, monkeypatch, catalogue / "Qwen__Qwen3.5-122B-A10B-FP8.yaml", "default",
        "sglang-cu130", "cuda:2,cuda:3",
    )  # fmt: skip
    assert plan["env"]["CUDA_VISIBLE_DEVICES"] == "2,3"


def test_a_model_without_a_context_length_gets_the_task_s_instead_of_none(
    catalogue: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # defog/sqlcoder-7b-2 sets neither max_sequence_length nor loadtime.max_seq_length: SIE
    # passes --context-length None, which SGLang refuses; the worker passes the task's.
    doc = _docs(catalogue)["defog__sqlcoder-7b-2.yaml"]
    assert "max_sequence_length" not in doc
    plan = _plan(capsys, monkeypatch, catalogue / "defog__sqlcoder-7b-2.yaml", "default", "sglang")
    argv = plan["argv"]
    assert argv[argv.index("--context-length") + 1] == str(
        doc["tasks"]["generate"]["context_length"]
    )
    long = _plan(
        capsys, monkeypatch, catalogue / "defog__sqlcoder-7b-2.yaml", "long-context", "sglang"
    )
    assert long["argv"][long["argv"].index("--context-length") + 1] == "16384"


def test_cu130_adapters_are_refused_on_the_older_bundle(
    catalogue: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SIE_BUNDLE", "sglang")
    assert main(["plan", str(catalogue / "google__gemma-4-31B-it.yaml"), "--devices", EIGHT]) == 1
    out = capsys.readouterr().out
    assert "SGLangGemmaAdapter needs SGLang 0.5.20 or later" in out
    assert "sglang-cu130 bundle" in out


def test_adapters_this_image_does_not_run_are_refused_when_the_model_loads(
    catalogue: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = catalogue / "BAAI__bge-base-en-v1.5.yaml"
    assert main(["validate", str(path)]) == 0
    capsys.readouterr()
    assert main(["plan", str(path), "--profile", "candle"]) == 1
    out = capsys.readouterr().out
    assert "sie_server_rust.adapters.candle:CandleEmbeddingAdapter is an adapter of SIE" in out
    assert "this image's bundles: default, llamacpp, sglang, sglang-cu130, vllm" in out
    assert "SIE serves it with the candle bundle" in out


# --- mutations keep seed 000's refusals -------------------------------------------------------


def _reserved_tokens() -> list[str]:
    """Every spelling SGLang's argparse reads as a reserved flag, in some release: each
    option string, each unique prefix of one, and their ``=value`` forms."""
    tokens: set[str] = set()
    for table in option_tables():
        for option in table.options:
            for end in range(3, len(option) + 1):
                prefix = option[:end]
                match = resolve(prefix, table)
                if match.dest in RESERVED_DESTS and not match.ambiguous:
                    tokens.add(prefix)
    return sorted(tokens | {f"{t}=1" for t in tokens})


def _mutable_profiles(catalogue: Path) -> Iterator[tuple[str, dict[str, Any], str]]:
    docs = _docs(catalogue)
    for file, name, _ in _sglang_profiles(catalogue):
        yield file, docs[file], name


def _loadtime(doc: dict[str, Any], profile: str) -> dict[str, Any]:
    options = doc["profiles"][profile].setdefault("adapter_options", {})
    loadtime: dict[str, Any] = options.setdefault("loadtime", {})
    return loadtime


def _problems(doc: dict[str, Any]) -> dict[str, str]:
    try:
        parse_config(doc, source="m.yaml")
    except InvalidConfig as exc:
        return {p.path: p.message for p in exc.problems}
    return {}


def test_reserved_flags_under_loadtime_are_refused_in_every_catalogue_profile(
    catalogue: Path,
) -> None:
    tokens = _reserved_tokens()
    profiles = list(_mutable_profiles(catalogue))
    assert len(tokens) > len({"--tp", "--port", "--host"})
    # Every spelling meets some real profile, and every profile meets some spellings.
    for i in range(max(len(tokens), len(profiles))):
        (file, doc, name), token = profiles[i % len(profiles)], tokens[i % len(tokens)]
        mutated = copy.deepcopy(doc)
        loadtime = _loadtime(mutated, name)
        args = list(loadtime.get("extra_launch_args") or [])
        index = len(args)
        loadtime["extra_launch_args"] = [*args, token, "2"]
        mutated["profiles"][name].pop("extra_launch_args", None)
        path = f"$.profiles.{name}.adapter_options.loadtime.extra_launch_args[{index}]"
        found = _problems(mutated)
        assert path in found, f"{file}:{name}: {token!r} was not refused ({found})"
        assert "reserved flag" in found[path]


@pytest.mark.parametrize(
    "variable", ["CUDA_VISIBLE_DEVICES", "cuda_visible_devices", " Nvidia_Visible_Devices ",
                 "ROCR_VISIBLE_DEVICES", "rocr_visible_devices\t"],
)  # fmt: skip
def test_device_variables_under_loadtime_are_refused_in_every_catalogue_profile(
    catalogue: Path, variable: str
) -> None:
    for file, doc, name in _mutable_profiles(catalogue):
        mutated = copy.deepcopy(doc)
        loadtime = _loadtime(mutated, name)
        loadtime["extra_env"] = {**(loadtime.get("extra_env") or {}), variable: "0"}
        mutated["profiles"][name].pop("extra_env", None)
        found = _problems(mutated)
        path = json_path(["profiles", name, "adapter_options", "loadtime", "extra_env", variable])
        assert path in found, f"{file}:{name}: {variable!r} was not refused ({found})"
        assert "device-visibility variable" in found[path]


@pytest.mark.parametrize("width", [0, 9, -1, 2.0, "2", True, None, 16])
def test_widths_outside_1_to_8_are_refused_in_every_catalogue_profile(
    catalogue: Path, width: object
) -> None:
    for file, doc, name in _mutable_profiles(catalogue):
        mutated = copy.deepcopy(doc)
        _loadtime(mutated, name)["tensor_parallel_size"] = width
        found = _problems(mutated)
        path = f"$.profiles.{name}.adapter_options.loadtime.tensor_parallel_size"
        assert path in found, f"{file}:{name}: width {width!r} was not refused"
        assert "must be an integer from 1 to 8" in found[path]


def test_a_width_above_the_device_count_is_refused_at_load(catalogue: Path) -> None:
    doc = _docs(catalogue)["zai-org__GLM-5.3-Flash.yaml"]
    served = served_model(parse_config(doc, source="m.yaml"), "default")
    settings = Settings(devices=tuple(f"cuda:{i}" for i in range(4)), bundle="sglang-cu130")
    with pytest.raises(InvalidConfig) as refused:
        resolve_load_options(served, settings, env={})
    assert any(
        "8 needs 8 GPUs but this worker has 4 device(s)" in p.message
        for p in refused.value.problems
    )


def _misspelled(key: str) -> str:
    """``key`` with two neighbouring letters swapped (the first pair that changes it)."""
    for i in range(len(key) - 1):
        if key[i] != key[i + 1] and key[i].isalpha() and key[i + 1].isalpha():
            return key[:i] + key[i + 1] + key[i] + key[i + 2 :]
    return key + "x"


def test_misspelled_loadtime_options_are_refused_with_their_spelling_in_every_profile(
    catalogue: Path,
) -> None:
    checked = 0
    for file, doc, name in _mutable_profiles(catalogue):
        adapter = resolve_adapter(_adapter_of(doc["profiles"], name) or "")
        bundle = adapter.bundle
        settings = Settings(devices=tuple(f"cuda:{i}" for i in range(8)), bundle=bundle)
        own = (doc["profiles"][name].get("adapter_options") or {}).get("loadtime") or {}
        for key in [k for k in own if k not in ("extra_launch_args", "extra_env")]:
            wrong = _misspelled(key)
            if wrong in adapter.loadtime_options:
                continue
            mutated = copy.deepcopy(doc)
            loadtime = _loadtime(mutated, name)
            loadtime[wrong] = loadtime.pop(key)
            served = served_model(parse_config(mutated, source="m.yaml"), name)
            with pytest.raises(InvalidConfig) as refused:
                resolve_load_options(served, settings, env={})
            path = f"$.profiles.{name}.adapter_options.loadtime.{wrong}"
            messages = {p.path: p.message for p in refused.value.problems}
            assert path in messages, f"{file}:{name}: {wrong!r} was not refused"
            assert messages[path].endswith(f"did you mean {key}?"), messages[path]
            checked += 1
    assert checked > len(list(_mutable_profiles(catalogue)))


_WORDS = ["", "default", "--tp=2", "CUDA_VISIBLE_DEVICES", "xgrammar", "gemma4", "nextn",
          "extra_buffer", "sie_server.adapters.gliner:GLiNERAdapter"]  # fmt: skip
_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 10**6),
    st.floats(allow_nan=True),
    st.sampled_from(_WORDS),
)


def _refused_with_paths(check: Callable[[], object]) -> bool:
    """Whether ``check`` raised InvalidConfig (every problem with a JSON path); any other
    exception fails the test."""
    try:
        check()
    except InvalidConfig as exc:
        problems = exc.problems
    else:
        return False
    assert all(p.path.startswith("$") for p in problems)
    return True


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_mutation_of_a_catalogue_config_is_read_and_loaded_or_refused_with_paths(
    catalogue: Path, data: st.DataObject
) -> None:
    docs = _docs(catalogue)
    name = data.draw(st.sampled_from(sorted(docs)))
    values = json_values(_LEAVES, max_size=3, max_leaves=6)
    doc = data.draw(
        mutated(lambda: copy.deepcopy(docs[name]), values, min_changes=1, max_changes=3)
    )
    if _refused_with_paths(lambda: parse_config(doc, source="m.yaml")):
        return
    config = parse_config(doc, source="m.yaml")
    settings_ = Settings(devices=tuple(f"cuda:{i}" for i in range(8)), bundle="sglang-cu130")
    for served in served_models(config):
        if _refused_with_paths(lambda: resolve_load_options(served, settings_, env={})):  # noqa: B023
            continue
        options = resolve_load_options(served, settings_, env={})
        plan = plan_launch(
            served, options, settings_.devices[: options.width], port=30000, nccl_port=30400,
            settings=settings_,
        )  # fmt: skip
        assert all(isinstance(a, str) for a in plan.argv)
        assert "None" not in plan.argv
