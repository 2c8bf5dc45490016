"""One spelling per setting: SIE's keys and ours read as one value, both refused naming both
paths; profile inheritance as SIE resolves it (null inherits, blocks replace whole, the
nearer of two spellings of extra_launch_args / extra_env wins)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from sie_worker.config.files.normalize import PROFILE_ALIASES, TOP_LEVEL_ALIASES, lookup
from sie_worker.config.files.reader import parse_config
from sie_worker.config.model import served_model, served_models
from sie_worker.errors import InvalidConfig

GENERATION = "sie_server.adapters.sglang.generation:SGLangGenerationAdapter"


def base() -> dict[str, Any]:
    return {
        "sie_id": "org/model",
        "hf_id": "org/model",
        "tasks": {"generate": {"context_length": 8192, "max_output_tokens": 512}},
        "profiles": {"default": {"adapter_path": GENERATION}, "other": {"extends": "default"}},
    }


def _set(doc: dict[str, Any], path: tuple[str | int, ...], value: Any) -> None:
    node = doc
    for part in path[:-1]:
        node = node.setdefault(part, {})  # type: ignore[assignment]
    node[path[-1]] = value  # type: ignore[index]


VALUES = {
    "revision": "v1.0",
    "model_path": "/models/org-model",
    "grammar_profile": "other",
    "max_sequence_length": 4096,
    "dense_dim": 384,
}


@pytest.mark.parametrize("alias", TOP_LEVEL_ALIASES, ids=lambda a: a.setting)
@pytest.mark.parametrize("spelling", ["sie", "ours"])
def test_either_spelling_of_a_setting_reads_as_one_value(alias: Any, spelling: str) -> None:
    doc = base()
    if alias.setting == "dense_dim":
        doc["tasks"]["encode"] = {}
    _set(doc, getattr(alias, spelling), VALUES[alias.setting])
    config = parse_config(doc, source="m.yaml")
    assert getattr(config, alias.setting) == VALUES[alias.setting]
    assert config.path_of(alias.setting) == getattr(alias, spelling)


@pytest.mark.parametrize("alias", TOP_LEVEL_ALIASES, ids=lambda a: a.setting)
def test_both_spellings_of_a_top_level_setting_are_refused_naming_both(alias: Any) -> None:
    doc = base()
    if alias.setting == "dense_dim":
        doc["tasks"]["encode"] = {}
    _set(doc, alias.sie, VALUES[alias.setting])
    _set(doc, alias.ours, VALUES[alias.setting])  # even the same value: one place to look
    with pytest.raises(InvalidConfig) as refused:
        parse_config(doc, source="m.yaml")
    ours = "$." + ".".join(str(p) for p in alias.ours)
    sie = "$." + ".".join(str(p) for p in alias.sie)
    found = {p.path: p.message for p in refused.value.problems}
    assert ours in found
    assert f"is also set at {sie}" in found[ours]
    assert "keep one of the two" in found[ours]


@pytest.mark.parametrize("alias", PROFILE_ALIASES, ids=lambda a: a.setting)
def test_both_spellings_of_launch_args_or_env_in_one_profile_are_refused(alias: Any) -> None:
    doc = base()
    value: Any = ["--stream-interval", "4"] if alias.setting == "extra_launch_args" else {"A": "1"}
    _set(doc["profiles"]["default"], alias.sie, value)
    _set(doc["profiles"]["default"], alias.ours, copy.deepcopy(value))
    with pytest.raises(InvalidConfig) as refused:
        parse_config(doc, source="m.yaml")
    [problem] = refused.value.problems
    assert problem.path == f"$.profiles.default.{alias.setting}"
    assert f"$.profiles.default.adapter_options.loadtime.{alias.setting}" in problem.message


@pytest.mark.parametrize("where", ["profile", "loadtime"])
def test_launch_args_and_env_are_read_from_either_place(where: str) -> None:
    doc = base()
    args, env = ["--stream-interval", "4"], {"NCCL_DEBUG": "INFO"}
    default = doc["profiles"]["default"]
    if where == "profile":
        default.update(extra_launch_args=args, extra_env=env)
        path = ("profiles", "default")
    else:
        default["adapter_options"] = {"loadtime": {"extra_launch_args": args, "extra_env": env}}
        path = ("profiles", "default", "adapter_options", "loadtime")
    profile = parse_config(doc, source="m.yaml").profiles["default"]
    assert profile.extra_launch_args == tuple(args)
    assert dict(profile.extra_env) == env
    assert profile.launch_args_path == (*path, "extra_launch_args")
    assert profile.env_path == (*path, "extra_env")
    # The loadtime options an adapter is checked against do not include them.
    assert "extra_launch_args" not in profile.loadtime
    assert "extra_env" not in profile.loadtime


# parent (profile-level, loadtime), child (profile-level, loadtime) -> the child's arguments
CHANNELS = [
    # nothing of its own: the parent's, whichever place it wrote them
    ((["--stream-interval=2"], None), (None, None), ["--stream-interval=2"]),
    ((None, ["--stream-interval=2"]), (None, None), ["--stream-interval=2"]),
    # its own profile-level arguments win, [] clears
    ((None, ["--stream-interval=2"]), (["--stream-interval=3"], None), ["--stream-interval=3"]),
    ((["--stream-interval=2"], None), ([], None), []),
    # its own loadtime arguments win
    ((["--stream-interval=2"], None), (None, ["--stream-interval=3"]), ["--stream-interval=3"]),
    # a nonempty loadtime block of its own without them drops the parent's loadtime ones...
    ((None, ["--stream-interval=2"]), (None, "block"), []),
    # ...but not the parent's profile-level ones (they are inherited apart from loadtime)
    ((["--stream-interval=2"], None), (None, "block"), ["--stream-interval=2"]),
]


@pytest.mark.parametrize(("parent", "child", "expected"), CHANNELS)
def test_the_nearer_spelling_of_extra_launch_args_wins(
    parent: tuple[Any, Any], child: tuple[Any, Any], expected: list[str]
) -> None:
    doc = base()
    for name, (own, loadtime) in (("default", parent), ("other", child)):
        profile = doc["profiles"][name]
        if own is not None:
            profile["extra_launch_args"] = own
        if loadtime == "block":
            profile["adapter_options"] = {"loadtime": {"watchdog_timeout_s": 60}}
        elif loadtime is not None:
            profile["adapter_options"] = {"loadtime": {"extra_launch_args": loadtime}}
    other = parse_config(doc, source="m.yaml").profiles["other"]
    assert list(other.extra_launch_args) == expected


def test_null_inherits_as_in_sie() -> None:
    doc = base()
    doc["profiles"]["default"].update(
        compute_precision="bfloat16", max_batch_tokens=4096, kv_budget_tokens=8192
    )
    doc["profiles"]["other"].update(
        compute_precision=None, max_batch_tokens=None, kv_budget_tokens=None, adapter_path=None
    )
    other = parse_config(doc, source="m.yaml").profiles["other"]
    assert other.compute_precision == "bfloat16"
    assert (other.max_batch_tokens, other.kv_budget_tokens) == (4096, 8192)
    assert other.adapter_path == GENERATION


def test_grammar_profile_is_never_inherited_and_adaptive_batching_merges() -> None:
    doc = base()
    doc["profiles"]["third"] = {
        "extends": "other",
        "adaptive_batching": {"max_wait_ms": 5.0, "enabled": None},
    }
    doc["profiles"]["other"].update(
        grammar_profile="default2", adaptive_batching={"enabled": False, "gain": 0.5}
    )
    doc["profiles"]["default2"] = {"extends": "default"}
    config = parse_config(doc, source="m.yaml")
    assert config.profiles["other"].grammar_profile == "default2"
    assert config.profiles["third"].grammar_profile is None
    assert dict(config.profiles["third"].adaptive_batching) == {
        "enabled": False,
        "gain": 0.5,
        "max_wait_ms": 5.0,
    }


def test_null_tasks_are_not_tasks_and_configs_without_default_serve_their_profiles() -> None:
    doc = base()
    doc["tasks"].update(encode=None, score=None, extract=None)
    doc["profiles"] = {"candle": {"adapter_path": GENERATION}}
    config = parse_config(doc, source="m.yaml")
    assert set(config.tasks) == {"generate"}
    assert [s.id for s in served_models(config)] == ["org/model:candle"]
    with pytest.raises(KeyError, match="no profile 'default'; profiles: candle"):
        served_model(config, "default")


def test_a_config_without_hf_id_is_served_under_its_sie_id() -> None:
    doc = base()
    del doc["hf_id"]
    doc["weights_path"] = "/models/org-model"
    config = parse_config(doc, source="m.yaml")
    assert config.hf_id == ""
    assert config.model_path == "/models/org-model"
    assert [s.id for s in served_models(config)] == ["org/model", "org/model:other"]


def test_served_models_merge_chat_template_kwargs_and_pick_their_output_cap() -> None:
    doc = base()
    doc["tasks"]["generate"]["chat_template_kwargs"] = {"enable_thinking": False}
    doc["profiles"]["other"].update(
        chat_template_kwargs={"enable_thinking": True}, max_output_tokens=256
    )
    config = parse_config(doc, source="m.yaml")
    default, other = served_models(config)
    assert dict(default.chat_template_kwargs) == {"enable_thinking": False}
    assert dict(other.chat_template_kwargs) == {"enable_thinking": True}
    assert (default.max_output_tokens, other.max_output_tokens) == (512, 256)


def test_pool_and_inputs_are_read_as_sie_reads_them() -> None:
    doc = {**base(), "pool": "  L4-Pool ", "inputs": {"text": True, "image": True}}
    config = parse_config(doc, source="m.yaml")
    assert config.pool == "l4-pool"
    assert config.inputs == ("text", "image")
    assert parse_config({**base(), "pool": " "}, source="m.yaml").pool is None
    assert parse_config(base(), source="m.yaml").inputs == ("text",)


def test_lookup_stops_at_missing_steps_and_nulls() -> None:
    doc = {"a": {"b": [1, {"c": None}]}}
    assert lookup(doc, ("a", "b", 1)) == {"c": None}
    assert lookup(doc, ("a", "b", 1, "c")) is None
    assert lookup(doc, ("a", "x", "y")) is None
    assert lookup(doc, ("a", "b", 5)) is None
