"""LoRA adapters in a config: SIE's and SGLang's spellings of ``lora_paths`` read alike, each
bad case refused at its JSON path with the fix, local folders checked when the model loads,
and the SGLang flags they become."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sie_worker.config.files.reader import parse_config
from sie_worker.config.load.loadtime import resolve_load_options
from sie_worker.config.lora import (
    NAME_PATTERN,
    LoraAdapter,
    lora_adapters,
    lora_problems,
    max_loras,
    sglang_lora_args,
)
from sie_worker.config.model import served_models
from sie_worker.config.rules import rule_problems
from sie_worker.errors import InvalidConfig
from sie_worker.settings import Settings

GENERATION = "sie_server.adapters.sglang.generation:SGLangGenerationAdapter"
SHA = "627c5ec1458b9086b841a91e0512fd31fd2fbbf1"
LT = "$.profiles.default.adapter_options.loadtime"


def _doc(loadtime: dict[str, Any], **profiles: Any) -> dict[str, Any]:
    return {
        "sie_id": "org/model",
        "hf_id": "org/model",
        "tasks": {"generate": {"context_length": 8192}},
        "profiles": {
            "default": {"adapter_path": GENERATION, "adapter_options": {"loadtime": loadtime}},
            **profiles,
        },
    }


def _problems(loadtime: dict[str, Any], **profiles: Any) -> dict[str, str]:
    return {p.path: p.message for p in rule_problems(_doc(loadtime, **profiles))}


def test_sie_and_sglang_spellings_declare_the_same_adapters() -> None:
    sie = {"sql": "org/sql-lora", "java": {"id": "org/java-lora", "revision": SHA}}
    sglang = [
        "sql=org/sql-lora",
        "org/bare",
        {"lora_name": "p", "lora_path": "/adapters/p", "pinned": True},
        '{"lora_name": "q", "lora_path": "org/q"}',
    ]
    assert lora_adapters({"lora_paths": sie}) == (
        LoraAdapter("sql", "org/sql-lora"),
        LoraAdapter("java", "org/java-lora", SHA),
    )
    assert lora_adapters({"lora_paths": sglang}) == (
        LoraAdapter("sql", "org/sql-lora"),
        LoraAdapter("org/bare", "org/bare"),
        LoraAdapter("p", "/adapters/p", pinned=True),
        LoraAdapter("q", "org/q"),
    )
    assert not _problems({"lora_paths": sie})
    assert not _problems({"lora_paths": sglang})


@pytest.mark.parametrize(
    ("lora_paths", "where", "says"),
    [
        ({}, "lora_paths", "nonempty mapping"),
        ("org/sql-lora", "lora_paths", "nonempty mapping"),
        (["sql=org/a", "sql=org/b"], "lora_paths[1]", "must be unique"),
        ({"sql:v2": "org/a"}, 'lora_paths["sql:v2"]', "is not allowed"),
        (["a,b=org/a"], "lora_paths[0]", "is not allowed"),
        (["/adapters/sql"], "lora_paths[0]", "write it as 'name=/folder'"),
        ({"sql": "not a repo"}, "lora_paths.sql", "nor a Hugging Face repo id"),
        ({"sql": "org/a--b"}, "lora_paths.sql", "nor a Hugging Face repo id"),
        ({"sql": 3}, "lora_paths.sql", "must be a repo id"),
        ({"sql": {"id": "org/a", "revision": "main"}}, "lora_paths.sql.revision", "40-character"),
        ({"sql": {"id": "org/a", "rev": SHA}}, "lora_paths.sql", "unknown key(s) rev"),
        ({"sql": {"id": ""}}, "lora_paths.sql", "id must be a nonempty repo id"),
        ([{"lora_name": "a"}], "lora_paths[0]", "needs lora_name and lora_path"),
        ([{"lora_name": "a", "lora_path": "org/a", "pin": True}], "lora_paths[0]", "unknown key"),
        ([{"lora_name": "a", "lora_path": "org/a", "pinned": "yes"}], "lora_paths[0]", "pinned"),
        (["{not json"], "lora_paths[0]", "does not parse"),
        ([3], "lora_paths[0]", "'name=path'"),
    ],
    ids=repr,
)
def test_each_bad_lora_paths_case_is_refused_at_its_path(
    lora_paths: Any, where: str, says: str
) -> None:
    problems = _problems({"lora_paths": lora_paths})
    assert says in problems[f"{LT}.{where}"], problems


def test_an_adapter_named_like_a_profile_is_refused() -> None:
    problems = _problems({"lora_paths": {"fast": "org/fast"}}, fast={"extends": "default"})
    assert "also a profile of this model" in problems[f"{LT}.lora_paths.fast"]


@pytest.mark.parametrize("value", [0, -1, "4", 1.5, True, None])
def test_max_loras_per_batch_must_be_a_positive_integer(value: Any) -> None:
    problems = _problems({"lora_paths": {"a": "org/a"}, "max_loras_per_batch": value})
    assert "integer of at least 1" in problems[f"{LT}.max_loras_per_batch"]


def test_pinning_every_batch_slot_is_refused_as_sglang_does() -> None:
    pinned = [{"lora_name": n, "lora_path": f"org/{n}", "pinned": True} for n in "ab"]
    problems = _problems({"lora_paths": pinned, "max_loras_per_batch": 2})
    assert "raise max_loras_per_batch to 3" in problems[f"{LT}.lora_paths"]
    assert not _problems({"lora_paths": pinned, "max_loras_per_batch": 3})


@given(st.text(min_size=1, max_size=40))
def test_names_never_hold_what_sglang_or_model_ids_split_on(name: str) -> None:
    problems = lora_problems({"lora_paths": {name: "org/a"}})
    ok = not any("adapter name" in message for _, message in problems)
    assert ok == bool(NAME_PATTERN.match(name))
    if ok:
        assert not set(name) & set(":=, \t\n")


def test_max_loras_defaults_to_sie_s_per_task() -> None:
    assert max_loras({}, "generate") == 4
    assert max_loras({}, "encode") == 8
    assert max_loras({"max_loras_per_batch": 2}, "generate") == 2


def test_sglang_gets_one_token_per_adapter_and_json_for_pinned_ones() -> None:
    args = sglang_lora_args((LoraAdapter("a", "/x/a"), LoraAdapter("b", "/x/b", pinned=True)), 3)
    assert args[:5] == ("--enable-lora", "--max-loras-per-batch", "3", "--lora-paths", "a=/x/a")
    assert json.loads(args[5]) == {"lora_name": "b", "lora_path": "/x/b", "pinned": True}
    assert sglang_lora_args((), 4) == ()


def _load(tmp_path: Path, lora_paths: Any, bundle: str = "sglang") -> Any:
    path = tmp_path / "model.yaml"
    doc = _doc({"lora_paths": lora_paths})
    path.write_text(json.dumps(doc), encoding="utf-8")
    config = parse_config(doc, source=str(path), base_dir=tmp_path)
    settings = Settings(devices=("cuda:0",), bundle=bundle)
    return resolve_load_options(served_models(config)[0], settings, env={})


def test_local_adapter_folders_resolve_against_the_config_folder(tmp_path: Path) -> None:
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "adapter_config.json").write_text("{}", encoding="utf-8")
    options = _load(tmp_path, {"sql": "./sql", "hub": "org/hub-lora"})
    assert options.loras == (
        LoraAdapter("sql", str((tmp_path / "sql").resolve())),
        LoraAdapter("hub", "org/hub-lora"),
    )
    assert options.max_loras_per_batch == 4


def test_a_missing_or_empty_adapter_folder_is_refused_when_the_model_loads(
    tmp_path: Path,
) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidConfig) as caught:
        _load(tmp_path, ["a=./missing", "b=./empty"])
    messages = {p.path: p.message for p in caught.value.problems}
    assert "is not a folder" in messages[f"{LT}.lora_paths[0]"]
    assert "has no adapter_config.json" in messages[f"{LT}.lora_paths[1]"]


def test_lora_flags_in_extra_launch_args_are_refused(tmp_path: Path) -> None:
    doc = _doc({"extra_launch_args": ["--lora-paths", "a=org/a", "--max-lora-rank", "64"]})
    config = parse_config(doc, source="<test>")
    settings = Settings(devices=("cuda:0",), bundle="sglang")
    with pytest.raises(InvalidConfig) as caught:
        resolve_load_options(served_models(config)[0], settings, env={})
    messages = {p.path: p.message for p in caught.value.problems}
    assert "declare them in loadtime.lora_paths" in messages[f"{LT}.extra_launch_args[0]"]
    assert len(messages) == 1  # --max-lora-rank is SGLang's own tuning, passed as written


def test_a_pin_the_engine_would_not_honour_is_a_warning(tmp_path: Path) -> None:
    doc = _doc({"lora_paths": {"sql": {"id": "org/sql-lora", "revision": SHA}}})
    served = served_models(parse_config(doc, source="<test>"))[0]
    for fetcher, warned in (("worker", False), ("engine", True)):
        settings = Settings(devices=("cuda:0",), bundle="sglang", weights_download=fetcher)
        warnings = resolve_load_options(served, settings, env={}).warnings
        assert any(f"revision {SHA} is applied when the worker" in w for w in warnings) is warned


@pytest.mark.parametrize(("loaded", "refused"), [("3", False), ("2", True), ("1", True)])
def test_max_loaded_loras_below_the_adapters_or_the_batch_is_refused_as_sglang_does(
    loaded: str, refused: bool
) -> None:
    loras = {"a": "org/a", "b": "org/b", "c": "org/c"}
    doc = _doc({"lora_paths": loras, "max_loras_per_batch": 2,
                "extra_launch_args": ["--max-loaded-loras", loaded]})  # fmt: skip
    served = served_models(parse_config(doc, source="<test>"))[0]
    settings = Settings(devices=("cuda:0",), bundle="sglang")
    if not refused:
        resolve_load_options(served, settings, env={})
        return
    with pytest.raises(InvalidConfig) as caught:
        resolve_load_options(served, settings, env={})
    (problem,) = caught.value.problems
    assert problem.path == f"{LT}.lora_paths"
    assert "raise --max-loaded-loras to 3" in problem.message
