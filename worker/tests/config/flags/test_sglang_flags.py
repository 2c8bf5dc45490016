"""The SGLang adapters' option table: every option, its flag in each release, its rule.

Exhaustive over the table: each option has a valid example that passes in both releases and
invalid ones that are refused with a message; every choice of every choice-valued flag of
each release passes, a value of another release is refused naming that release.
"""

from __future__ import annotations

from typing import Any

import pytest

from sie_worker.config.adapters import (
    CHAT,
    CUDA13,
    EMBEDDING,
    GEMMA,
    GENERATION,
    STRICT_THINKING,
    resolve_adapter,
)
from sie_worker.config.flags.option_tables import option_tables, table_for
from sie_worker.engines.sglang.flags import (
    FAMILIES,
    SGLANG_OPTIONS,
    SPECULATIVE_KEYS,
    Release,
    choice_problem,
    option_problem,
    options_for,
    speculative_args,
)

RELEASES = [Release(t.version, f"bundle-of-{t.version}", t) for t in option_tables()]
NEW, OLD = (table_for("0.5.23"), table_for("0.5.10.post1"))
SHA = "627c5ec1458b9086b841a91e0512fd31fd2fbbf1"

VALID: dict[str, Any] = {
    "tensor_parallel_size": 2,
    "pipeline_parallel_size": 2,
    "request_read_timeout_s": 600,
    "startup_timeout_s": 900.5,
    "watchdog_timeout_s": 300,
    "disable_piecewise_cuda_graph": False,
    "nccl_port": 31000,
    "disable_cuda_graph": True,
    "mem_fraction_static": 0.85,
    "max_seq_length": 32768,
    "compute_precision": "bfloat16",
    "revision": SHA,
    "trust_remote_code": False,
    "served_model_name": "Qwen/Qwen3-0.6B",
    "attention_backend": "triton",
    "grammar_backend": None,
    "reasoning_parser": "qwen3",
    "tool_call_parser": "qwen3_coder",
    "stream_interval": 4,
    "speculative": {
        "enabled": True,
        "algorithm": "nextn",
        "num_steps": 3,
        "eagle_topk": 1,
        "num_draft_tokens": 4,
        "draft_model": "org/draft",
        "draft_model_revision": SHA,
    },
    "speculative_needs_extra_buffer": False,
    "chat_template": "chatml",
    "default_sampling": {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_new_tokens": 1},
    "stop_tokens": ["<|im_end|>"],
    "json_number_max_digits": 19,
    "thinking_budget": 512,
    "guard": {"threshold": 0.5, "positive": "Yes"},
    "mlx_repo": "mlx-community/x",
    "config_kwargs": {"use_cache": False},
    "lora_paths": {"sql": "org/sql-lora", "java": {"id": "org/java-lora", "revision": "a" * 40}},
    "max_loras_per_batch": 4,
    "dense_dim": 1024,
    "normalize": True,
    "query_template": "Instruct: {instruction}\nQuery: {text}",
    "doc_template": "{text}",
    "default_instruction": "Given a query",
    "append_eos": True,
    "embed_concurrency": 8,
    "max_concurrent_dispatch": 4,
}
INVALID: dict[str, list[Any]] = {
    "tensor_parallel_size": [0, 9, 2.0, "2", True, None],
    "pipeline_parallel_size": [0, 9, 2.0, "2", True, None],
    "request_read_timeout_s": [0, -1, "600", float("inf"), None, True],
    "startup_timeout_s": [0, float("nan"), "900"],
    "watchdog_timeout_s": [0, "300", [300]],
    "disable_piecewise_cuda_graph": ["no", 1, None],
    "nccl_port": [80, 70000, "31000", 31000.0, True],
    "disable_cuda_graph": ["true", 0],
    "mem_fraction_static": [0, 1, 1.2, -0.1, "0.85", True, float("nan")],
    "max_seq_length": [0, 2.5, "8192", None, 2**31],
    "compute_precision": ["bf16", "fp8", None, 16],
    "revision": ["", "a b", 12],
    "trust_remote_code": ["yes", 1, None],
    "served_model_name": ["", " ", 3, None],
    "attention_backend": ["flashattn", "", 3, None],
    "grammar_backend": ["xgramar", "", 1],
    "reasoning_parser": ["qwen", None, ""],
    "tool_call_parser": ["qwen4", None],
    "stream_interval": [0, -1, "4", 2.5, True, None],
    "speculative": [
        "on",
        {"enabled": "yes"},
        {"enabled": True},
        {"enabled": True, "algorithm": "nextn", "num_steps": 0},
        {"enabled": True, "algorithm": "nextn", "num_step": 3},
        {"enabled": False, "draft_model_revision": "main"},
        {"enabled": True, "algorithm": "nextn", "draft_model": ""},
    ],
    "speculative_needs_extra_buffer": ["false", None],
    "chat_template": ["", None, 3],
    "default_sampling": [{"temperature": -1}, {"top_p": 0}, {"min_p": 0.1}, [0.7]],
    "stop_tokens": ["<|im_end|>", [""], [1]],
    "json_number_max_digits": [0, "19", 1.5],
    "thinking_budget": [0, None],
    "guard": [{"threshold": 1.5}, {"threshold": "0.5"}, "yes", {"positive": ""}],
    "mlx_repo": ["", None],
    "config_kwargs": ["use_cache", None],
    "lora_paths": [{}, [], "org/sql-lora", {"a:b": "org/x"}, ["sql=org/x", "sql=org/y"]],
    "max_loras_per_batch": [0, "4", True],
    "dense_dim": [0, "1024"],
    "normalize": ["true", None],
    "query_template": [3, ""],
    "doc_template": [None],
    "default_instruction": [[]],
    "append_eos": ["yes"],
    "embed_concurrency": [0],
    "max_concurrent_dispatch": [0, 1.5],
}


def test_every_option_has_examples_and_a_rule() -> None:
    later = {n for n, o in SGLANG_OPTIONS.items() if o.applied == "later"}
    assert set(VALID) == set(SGLANG_OPTIONS) - later
    assert set(INVALID) == set(SGLANG_OPTIONS)
    assert later == set()


@pytest.mark.parametrize("release", RELEASES, ids=lambda r: r.version)
@pytest.mark.parametrize("name", sorted(VALID))
def test_valid_values_pass_in_every_release(release: Release, name: str) -> None:
    assert option_problem(name, VALID[name], release) is None


@pytest.mark.parametrize("release", RELEASES, ids=lambda r: r.version)
@pytest.mark.parametrize(
    ("name", "value"), [(n, v) for n, values in INVALID.items() for v in values], ids=repr
)
def test_invalid_values_are_refused_with_a_message(release: Release, name: str, value: Any) -> None:
    message = option_problem(name, value, release)
    assert message, f"{name}={value!r} passed"
    assert "must" in message or "not" in message or "needs" in message or "required" in message


@pytest.mark.parametrize("name", sorted(SGLANG_OPTIONS))
def test_flags_exist_in_the_releases_the_option_is_accepted_on(name: str) -> None:
    option = SGLANG_OPTIONS[name]
    assert option.families, name
    assert option.meaning, name
    if option.flag is not None:
        assert any(t.has(option.flag) for t in option_tables()), f"{option.flag} in no release"
    if option.applied == "flag" and option.flag is not None:
        for release in RELEASES:
            assert release.table is not None
            if release.table.has(option.flag):
                continue
            # An option whose flag a release lacks is refused there, saying so.
            message = option_problem(name, VALID[name], release)
            assert message is not None
            assert f"needs {option.flag}" in message


def test_a_flag_a_release_lacks_is_refused_with_why() -> None:
    # A release whose table lacks --attention-backend (a stand-in for one that never had it).
    assert NEW is not None
    trimmed = type(NEW)(
        "9.9.9",
        {k: v for k, v in NEW.options.items() if k != "--attention-backend"},
        actions=NEW.actions,
    )
    message = option_problem("attention_backend", "triton", Release("9.9.9", "x", trimmed))
    assert message == (
        "needs --attention-backend, which SGLang 9.9.9 (bundle x) lacks: remove it, or serve "
        "the model from a bundle whose SGLang has it"
    )


CHOICE_FLAGS = {
    "attention_backend": "--attention-backend",
    "grammar_backend": "--grammar-backend",
    "reasoning_parser": "--reasoning-parser",
    "tool_call_parser": "--tool-call-parser",
}


@pytest.mark.parametrize("release", RELEASES, ids=lambda r: r.version)
@pytest.mark.parametrize("name", sorted(CHOICE_FLAGS))
def test_every_choice_of_the_release_passes_and_others_are_refused(
    release: Release, name: str
) -> None:
    assert release.table is not None
    action = release.table.action_of(CHOICE_FLAGS[name])
    assert action is not None
    assert action.choices
    for choice in action.choices:
        assert option_problem(name, choice, release) is None
    message = option_problem(name, "no-such-backend", release)
    assert message is not None
    assert f"is not a {CHOICE_FLAGS[name]} choice of SGLang {release.version}" in message
    others = [r for r in RELEASES if r is not release]
    for other in others:
        assert other.table is not None
        extra = set(other.table.action_of(CHOICE_FLAGS[name]).choices or ()) - set(action.choices)  # type: ignore[union-attr]
        for value in sorted(extra):
            message = option_problem(name, value, release)
            assert message is not None
            assert f"is a choice in SGLang {other.version}" in message


def test_gemma4_parsers_are_refused_on_the_older_release_naming_the_newer() -> None:
    old = next(r for r in RELEASES if r.version == "0.5.10.post1")
    message = choice_problem("--reasoning-parser", "gemma4", old)
    assert message is not None
    assert "'gemma4' is a choice in SGLang 0.5.23" in message
    assert choice_problem("--reasoning-parser", "gemma4", Release("0.5.23", "x", NEW)) is None
    assert choice_problem("--reasoning-parser", "gemma4", Release("0.5.20", "x", None)) is None


def test_speculative_algorithms_follow_the_release_choices() -> None:
    old = next(r for r in RELEASES if r.version == "0.5.10.post1")
    new = next(r for r in RELEASES if r.version == "0.5.23")
    spec = {"enabled": True, "algorithm": "dflash"}
    assert "DFLASH" in (option_problem("speculative", spec, old) or "")
    assert option_problem("speculative", spec, new) is None  # a free string in 0.5.23


def test_speculative_args_map_each_key_to_its_flag() -> None:
    assert speculative_args({"enabled": False, "algorithm": "nextn"}) == ()
    assert speculative_args(VALID["speculative"]) == (
        "--speculative-algorithm", "NEXTN",
        "--speculative-num-steps", "3",
        "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "4",
        "--speculative-draft-model-path", "org/draft",
        "--speculative-draft-model-revision", SHA,
    )  # fmt: skip
    flags = {v for k, v in SPECULATIVE_KEYS.items() if k != "enabled"}
    for table in option_tables():
        assert all(table.has(flag) for flag in flags)


ADAPTER_FAMILIES = {
    GENERATION: "generation",
    GEMMA: "generation",
    CUDA13: "generation",
    STRICT_THINKING: "generation",
    CHAT: "chat",
    EMBEDDING: "embedding",
}


@pytest.mark.parametrize("path", sorted(ADAPTER_FAMILIES))
def test_each_sglang_adapter_accepts_its_family_s_options(path: str) -> None:
    adapter = resolve_adapter(path)
    family = ADAPTER_FAMILIES[path]
    assert set(FAMILIES) == {"generation", "embedding", "chat"}
    assert adapter.loadtime_options == options_for(family)  # type: ignore[arg-type]
    assert all(o in SGLANG_OPTIONS for o in adapter.loadtime_options)


def test_families_accept_what_sie_s_adapters_accept() -> None:
    generation, embedding, chat = (set(options_for(f)) for f in ("generation", "embedding", "chat"))  # type: ignore[arg-type]
    assert chat == generation | {"chat_template"}
    assert {"attention_backend", "speculative", "served_model_name"} <= generation - embedding
    assert {"normalize", "append_eos", "query_template"} <= embedding - generation
    assert {"lora_paths", "max_loras_per_batch", "mem_fraction_static"} <= generation & embedding
