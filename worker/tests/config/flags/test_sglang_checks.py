"""Load-time checks of SGLang profiles against the bundle's release: adapters that need a
newer engine, option pairs, the speculative extra-buffer guard, extra_launch_args flags."""

from __future__ import annotations

from typing import Any

import pytest

from sie_worker.config.files.reader import parse_config
from sie_worker.config.flags.option_tables import table_for
from sie_worker.config.load.load_options import LoadOptions
from sie_worker.config.load.loadtime import resolve_load_options
from sie_worker.config.model import served_model
from sie_worker.engines.sglang.checks import mamba_strategy
from sie_worker.errors import InvalidConfig
from sie_worker.settings import Settings

GENERATION = "sie_server.adapters.sglang.generation:SGLangGenerationAdapter"
GEMMA = "sie_server.adapters.sglang.gemma:SGLangGemmaAdapter"
STRICT = "sie_server.adapters.sglang.cuda13:SGLangStrictThinkingAdapter"
LT = "$.profiles.default.adapter_options.loadtime"


def _load(
    loadtime: dict[str, Any], *, adapter: str = GENERATION, bundle: str = "sglang", **env: str
) -> LoadOptions:
    doc = {
        "sie_id": "org/model",
        "hf_id": "org/model",
        "tasks": {"generate": {"context_length": 8192, "max_output_tokens": 512}},
        "profiles": {
            "default": {"adapter_path": adapter, "adapter_options": {"loadtime": loadtime}}
        },
    }
    served = served_model(parse_config(doc, source="m.yaml"), "default")
    return resolve_load_options(served, Settings(devices=("cuda:0",), bundle=bundle), env=env)


def _refusal(loadtime: dict[str, Any], **kwargs: Any) -> dict[str, str]:
    with pytest.raises(InvalidConfig) as refused:
        _load(loadtime, **kwargs)
    return {p.path: p.message for p in refused.value.problems}


@pytest.mark.parametrize("adapter", [GEMMA, STRICT])
def test_cu130_adapters_are_refused_on_the_older_bundle_and_served_on_theirs(adapter: str) -> None:
    found = _refusal({}, adapter=adapter, bundle="sglang")
    message = found["$.profiles.default.adapter_path"]
    assert "needs SGLang 0.5.20 or later" in message
    assert "SGLang 0.5.10.post1 (bundle sglang)" in message
    assert "serve it from a pool with the sglang-cu130 bundle" in message
    assert _load({}, adapter=adapter, bundle="sglang-cu130").engine_version == "0.5.23"
    # SIE_SGLANG_VERSION names the engine's release where the image differs.
    assert _load({}, adapter=adapter, bundle="sglang", SIE_SGLANG_VERSION="0.5.20").engine_version


def test_the_release_is_the_bundle_s_unless_sie_sglang_version_says_otherwise() -> None:
    assert _load({}, bundle="sglang").engine_version == "0.5.10.post1"
    assert _load({}, bundle="sglang-cu130").engine_version == "0.5.23"
    assert _load({}, bundle="sglang", SIE_SGLANG_VERSION="0.5.21").engine_version == "0.5.21"


def test_option_pairs_follow_sie_s_rules() -> None:
    found = _refusal(
        {"json_number_max_digits": 19, "thinking_budget": 64, "reasoning_parser": "glm45"}
    )
    assert "needs grammar_backend: xgrammar" in found[f"{LT}.json_number_max_digits"]
    assert "needs reasoning_parser qwen3 or gemma4" in found[f"{LT}.thinking_budget"]
    ok = _load({"json_number_max_digits": 19, "grammar_backend": "xgrammar"})
    assert any("json_number_max_digits: accepted but not applied" in w for w in ok.warnings)


SPEC = {"enabled": True, "algorithm": "nextn", "num_steps": 3}


@pytest.mark.parametrize(
    ("bundle", "args", "ok"),
    [
        ("sglang", ["--mamba-scheduler-strategy", "extra_buffer"], True),
        ("sglang", ["--mamba-scheduler-strategy=extra_buffer"], True),
        (
            "sglang",
            ["--mamba-sched", "extra_buffer"],
            True,
        ),  # a unique prefix, as argparse reads it
        (
            "sglang",
            ["--mamba-scheduler-strategy", "extra_buffer", "--mamba-scheduler-strategy", "auto"],
            False,
        ),
        ("sglang", ["--mamba-scheduler-strategy", "no_buffer"], False),
        ("sglang", [], False),
        ("sglang-cu130", ["--mamba-radix-cache-strategy", "extra_buffer"], True),
        ("sglang-cu130", ["--stream-interval", "extra_buffer"], False),
    ],
)
def test_speculative_decoding_needs_the_release_s_extra_buffer_strategy(
    bundle: str, args: list[str], ok: bool
) -> None:
    loadtime = {"speculative": SPEC, "extra_launch_args": args}
    if ok:
        _load(loadtime, bundle=bundle)
        return
    message = _refusal(loadtime, bundle=bundle)[f"{LT}.speculative"]
    flag = "--mamba-scheduler-strategy" if bundle == "sglang" else "--mamba-radix-cache-strategy"
    assert f"'{flag} extra_buffer'" in message
    assert "speculative_needs_extra_buffer: false" in message


def test_the_extra_buffer_guard_is_off_when_asked_or_without_speculation() -> None:
    _load({"speculative": SPEC, "speculative_needs_extra_buffer": False})
    _load({"speculative": {**SPEC, "enabled": False}})


def test_mamba_strategy_reads_the_last_setting_in_either_form() -> None:
    table = table_for("0.5.23")
    assert table is not None
    assert mamba_strategy(("--mamba-radix-cache-strategy=auto",), table) == (
        "--mamba-radix-cache-strategy",
        "auto",
    )
    assert mamba_strategy(("--x", "1"), table) == ("--mamba-radix-cache-strategy", None)


@pytest.mark.parametrize(
    ("bundle", "token", "says"),
    [
        ("sglang", "--mamba-radix-cache-strategy", "did you mean --mamba-scheduler-strategy?"),
        ("sglang-cu130", "--mamba-scheduler-strategy", "is not an option of SGLang 0.5.23"),
        ("sglang-cu130", "--disable-piecewise-cuda-graph", "is not an option of SGLang 0.5.23"),
        (
            "sglang-cu130",
            "--cuda-graph-max-bs",
            "could be --cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill",
        ),
        ("sglang", "--enable-strict-thinking", "is not an option of SGLang 0.5.10.post1"),
    ],
)
def test_extra_launch_args_flags_must_be_options_of_the_release(
    bundle: str, token: str, says: str
) -> None:
    found = _refusal({"extra_launch_args": ["--quantization", "fp8", token, "8"]}, bundle=bundle)
    assert says in found[f"{LT}.extra_launch_args[2]"]


def test_values_and_known_flags_in_extra_launch_args_pass() -> None:
    args = [
        "--kv-cache-dtype",
        "fp8_e4m3",
        "--mm-process-config",
        '{"image": {}}',
        "--chunked-prefill-size",
        "-1",
    ]
    assert _load({"extra_launch_args": args}, bundle="sglang-cu130").width == 1
    # SGLang versions without a shipped table skip the release checks.
    _load({"extra_launch_args": ["--not-yet-a-flag"]}, bundle="sglang", SIE_SGLANG_VERSION="0.6.0")


def test_hook_options_are_accepted_with_a_warning_and_not_passed() -> None:
    options = _load(
        {"thinking_budget": 64, "reasoning_parser": "qwen3", "guard": {"threshold": 0.5}}
    )
    warned = " ".join(options.warnings)
    assert "thinking_budget: accepted but not applied" in warned
    assert "guard: accepted but not applied" in warned
