"""Read-time rules: the width rule shared by the load-time head check and ``sie-worker
size``, and the document rules beyond the schema (weight source, one spelling, launch args
and env in either place, grammar targets, routing, runtime options)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from sie_worker.config.rules import rule_problems
from sie_worker.config.widths import MAX_WIDTH, valid_widths, width_fits_heads


def test_width_rule_rejects_widths_outside_1_to_8() -> None:
    assert not width_fits_heads(0, 64, 8)
    assert not width_fits_heads(16, 64, 8)
    assert width_fits_heads(8, 64, 8)


def test_fourteen_heads_with_two_kv_heads_fit_widths_1_and_2() -> None:
    assert valid_widths(14, 2) == (1, 2)


@given(heads=st.integers(1, 512), kv=st.integers(1, 512), width=st.integers(-2, 12))
def test_a_width_fits_when_it_divides_the_heads_and_meets_the_kv_heads(
    heads: int, kv: int, width: int
) -> None:
    expected = (
        1 <= width <= MAX_WIDTH and heads % width == 0 and (kv % width == 0 or width % kv == 0)
    )
    assert width_fits_heads(width, heads, kv) is expected
    assert (width in valid_widths(heads, kv)) is expected


# --- the read-time rules beyond the schema ----------------------------------------------------

GENERATION = "sie_server.adapters.sglang.generation:SGLangGenerationAdapter"


def _doc(**top: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "sie_id": "org/model",
        "hf_id": "org/model",
        "tasks": {"generate": {"context_length": 8192, "max_output_tokens": 512}},
        "profiles": {"default": {"adapter_path": GENERATION}},
    }
    doc.update(top)
    return doc


def _found(doc: dict[str, Any]) -> dict[str, str]:
    return {p.path: p.message for p in rule_problems(doc)}


# Tokens and variables the seed refuses, and ones it lets through.
_TOKENS = st.sampled_from(
    ["--tp", "--tp=2", "--tensor-parallel", "--dp-size=2", "--nccl-port", "--po", "--host=x",
     "--base-gpu-id", "--stream-interval", "16", "--quantization", "fp8", "--p"]
)  # fmt: skip
_VARIABLES = st.sampled_from(
    ["CUDA_VISIBLE_DEVICES", "cuda_visible_devices", " ROCR_VISIBLE_DEVICES", "NCCL_DEBUG",
     "Nvidia_Visible_Devices", "OMP_NUM_THREADS"]
)  # fmt: skip


@given(
    args=st.lists(_TOKENS, max_size=6), env=st.dictionaries(_VARIABLES, st.just("1"), max_size=3)
)
def test_loadtime_launch_args_and_env_get_exactly_the_profile_level_refusals(
    args: list[str], env: dict[str, str]
) -> None:
    profile_level = _doc()
    profile_level["profiles"]["default"].update(extra_launch_args=args, extra_env=env)
    loadtime = _doc()
    loadtime["profiles"]["default"]["adapter_options"] = {
        "loadtime": {"extra_launch_args": args, "extra_env": env}
    }
    moved = {
        path.replace("$.profiles.default.", "$.profiles.default.adapter_options.loadtime."): m
        for path, m in _found(profile_level).items()
    }
    assert _found(loadtime) == moved


def test_a_config_needs_a_weight_source_unless_package_or_remote_backed() -> None:
    doc = _doc()
    del doc["hf_id"]
    assert "is required" in _found(doc)["$.hf_id"]
    assert _found({**doc, "weights_path": "/w"}) == {}
    assert _found({**doc, "model_path": "/w"}) == {}
    assert _found({**doc, "package_backed": True}) == {}
    found = _found({**_doc(), "package_backed": True, "hf_revision": "main"})
    assert set(found) == {"$.hf_id", "$.hf_revision"}
    assert "cannot be set with package_backed: true" in found["$.hf_id"]
    remote = _doc(remote_backed=True, package_backed=True)
    del remote["hf_id"]
    assert set(_found(remote)) >= {"$.package_backed", "$.profiles.default.adapter_path"}


def test_a_remote_backed_model_takes_only_remote_adapters() -> None:
    doc = _doc(remote_backed=True)
    del doc["hf_id"]
    doc["profiles"]["default"]["adapter_path"] = (
        "sie_server.adapters.remote.openai:OpenAIUpstreamAdapter"
    )
    assert _found(doc) == {}


def test_every_task_null_is_no_task() -> None:
    found = _found(_doc(tasks={"generate": None, "encode": None}))
    assert "declares no task" in found["$.tasks"]
    assert _found(_doc(tasks={"score": {}})) == {}


def test_the_default_pool_name_is_reserved() -> None:
    assert "reserved" in _found(_doc(pool=" _Default "))["$.pool"]
    assert _found(_doc(pool="l4-pool")) == {}


def test_prewarm_grammar_values_fit_their_kind() -> None:
    grammars = [
        {"name": "a", "kind": "regex", "value": {"type": "object"}},
        {"name": "b", "kind": "json_schema", "value": "(yes|no)"},
        {"name": "c", "kind": "ebnf", "value": "root ::= 'x'"},
    ]
    doc = _doc()
    doc["tasks"]["generate"]["prewarm_grammars"] = grammars
    found = _found(doc)
    base = "$.tasks.generate.prewarm_grammars"
    assert set(found) == {f"{base}[0].value", f"{base}[1].value"}
    assert "a string" in found[f"{base}[0].value"]
    assert "a mapping" in found[f"{base}[1].value"]


def test_grammar_targets_exist_declare_none_and_do_not_speculate() -> None:
    doc = _doc()
    doc["tasks"]["generate"]["grammar_profile"] = "fast"
    doc["profiles"]["fast"] = {
        "extends": "default",
        "grammar_profile": "plain",
        "adapter_options": {"loadtime": {"speculative": {"enabled": True, "algorithm": "nextn"}}},
    }
    doc["profiles"]["plain"] = {"extends": "default"}
    messages = [
        p.message for p in rule_problems(doc) if p.path == "$.tasks.generate.grammar_profile"
    ]
    assert len(messages) == 2
    assert "declares a grammar_profile itself" in messages[0]
    assert "enables speculative decoding" in messages[1]
    doc["profiles"]["default"]["grammar_profile"] = "plain"
    assert "not allowed on default" in _found(doc)["$.profiles.default.grammar_profile"]


def test_profile_generation_keys_need_a_model_that_generates() -> None:
    doc = _doc(tasks={"encode": {"dense": {"dim": 8}}})
    doc["profiles"]["default"].update(max_output_tokens=5, chat_template_kwargs={})
    found = _found(doc)
    assert set(found) == {
        "$.profiles.default.max_output_tokens",
        "$.profiles.default.chat_template_kwargs",
    }


def test_routing_fields_fit_the_policy() -> None:
    doc = _doc(routing={"policy": "threshold", "fallback_profile": "default", "wake_above": 1.0})
    found = _found(doc)
    assert "non-default profile" in found["$.routing.fallback_profile"]
    assert {"$.routing.sleep_below", "$.routing.window_s", "$.routing.cooldown_s"} <= set(found)
    doc = _doc(routing={"policy": "remote_only", "fallback_profile": "x"})
    found = _found(doc)
    assert "remote_backed" in found["$.routing.policy"]
    assert "does not apply" in found["$.routing.fallback_profile"]


def test_runtime_options_the_worker_applies_are_checked_where_written() -> None:
    doc = _doc()
    doc["profiles"]["fast"] = {
        "extends": "default",
        "adapter_options": {"runtime": {"overall_timeout_s": -1, "stop_tokens": "x"}},
    }
    found = _found(doc)
    assert set(found) == {
        "$.profiles.fast.adapter_options.runtime.overall_timeout_s",
        "$.profiles.fast.adapter_options.runtime.stop_tokens",
    }
