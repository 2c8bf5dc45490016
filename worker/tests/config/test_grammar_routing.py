"""Which profile answers a grammar-constrained request: SIE's rules, over resolved configs."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sie_worker.config.files.reader import parse_config
from sie_worker.config.grammar_routing import grammar_compatible, grammar_profile_for

GEN = "sie_server.adapters.sglang.generation:SGLangGenerationAdapter"
SPEC_ON = {"speculative": {"enabled": True, "algorithm": "EAGLE"}}
SPEC_OFF = {"speculative": {"enabled": False}}


def _config(profiles: dict[str, Any], grammar_profile: str | None = "safe") -> Any:
    generate: dict[str, Any] = {"context_length": 4096, "max_output_tokens": 256}
    if grammar_profile is not None:
        generate["grammar_profile"] = grammar_profile
    return parse_config(
        {
            "sie_id": "org/m",
            "hf_id": "org/m",
            "tasks": {"generate": generate},
            "profiles": profiles,
        },
        source=None,
    )


def _profile(loadtime: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"adapter_path": GEN, "adapter_options": {"loadtime": loadtime}, **extra}


def test_speculative_default_sends_grammar_requests_to_the_grammar_profile() -> None:
    config = _config({"default": _profile(SPEC_ON), "safe": _profile(SPEC_OFF)})
    assert grammar_profile_for(config, "default") == "safe"
    assert grammar_profile_for(config, "safe") == "safe"


def test_a_default_that_already_enforces_grammars_keeps_the_request() -> None:
    # SIE's Qwen3.5-122B: speculation off on default, no-spec extends it.
    config = _config(
        {"default": _profile(SPEC_OFF), "safe": {"extends": "default"}}, grammar_profile="safe"
    )
    assert grammar_profile_for(config, "default") == "default"


def test_a_default_with_another_grammar_backend_is_not_compatible() -> None:
    config = _config(
        {
            "default": _profile({**SPEC_OFF, "grammar_backend": "outlines"}),
            "safe": _profile({**SPEC_OFF, "grammar_backend": "xgrammar"}),
        }
    )
    assert grammar_profile_for(config, "default") == "safe"


def test_raw_speculative_flags_make_a_profile_incompatible() -> None:
    args = ["--speculative-num-steps", "3"]
    config = _config(
        {
            "default": _profile(SPEC_OFF, extra_launch_args=args),
            "safe": _profile(SPEC_OFF, extra_launch_args=args),
        }
    )
    assert grammar_profile_for(config, "default") == "safe"


def test_a_variant_with_its_own_grammar_profile_goes_there() -> None:
    config = _config(
        {
            "default": _profile(SPEC_ON),
            "safe": _profile(SPEC_OFF),
            "fast": _profile(SPEC_ON, grammar_profile="fast-safe"),
            "fast-safe": _profile(SPEC_OFF),
        }
    )
    assert grammar_profile_for(config, "fast") == "fast-safe"
    assert grammar_profile_for(config, "fast-safe") == "fast-safe"


def test_a_compatible_variant_extending_the_grammar_profile_keeps_the_request() -> None:
    config = _config(
        {
            "default": _profile(SPEC_ON),
            "safe": _profile(SPEC_OFF),
            "long": {"extends": "safe"},
            "other": _profile(SPEC_ON),
        }
    )
    assert grammar_profile_for(config, "long") == "long"
    assert grammar_profile_for(config, "other") == "safe"


def test_without_a_grammar_profile_every_request_stays() -> None:
    config = _config({"default": _profile(SPEC_ON), "fast": _profile(SPEC_ON)}, None)
    assert grammar_profile_for(config, "default") == "default"
    assert grammar_profile_for(config, "fast") == "fast"


@pytest.mark.parametrize("args", [(), ("--quantization", "fp8")])
def test_compatible_launch_arguments(args: tuple[str, ...]) -> None:
    config = _config(
        {"default": _profile(SPEC_OFF, extra_launch_args=list(args)), "safe": _profile(SPEC_OFF)}
    )
    assert grammar_compatible(config.profiles["default"], config.profiles["safe"])


@given(
    default_spec=st.sampled_from([None, True, False]),
    safe_spec=st.sampled_from([None, False]),
    backend=st.sampled_from([None, "xgrammar", "outlines"]),
)
def test_the_answering_profile_is_the_one_sent_to_or_the_grammar_profile(
    default_spec: bool | None, safe_spec: bool | None, backend: str | None
) -> None:
    def loadtime(spec: bool | None) -> dict[str, Any]:
        out: dict[str, Any] = {} if spec is None else {"speculative": {"enabled": spec}}
        return out | ({"grammar_backend": backend} if backend else {})

    config = _config(
        {"default": _profile(loadtime(default_spec)), "safe": _profile(loadtime(safe_spec))}
    )
    chosen = grammar_profile_for(config, "default")
    assert chosen in ("default", "safe")
    assert (chosen == "default") == (default_spec is False)
