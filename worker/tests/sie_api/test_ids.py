"""Which served model an SIE path names."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sie_worker.errors import AmbiguousModel, InvalidRequest
from sie_worker.sie_api.ids import resolve_model_id, with_profile

KNOWN = {"BAAI/bge-m3", "BAAI/bge-m3:fast", "Qwen/Qwen3-4B", "Qwen/Qwen3-4B:fast", "org/a__b"}


@pytest.mark.parametrize(
    ("asked", "generate", "expected"),
    [
        ("BAAI/bge-m3", False, "BAAI/bge-m3"),
        ("BAAI/bge-m3:default", False, "BAAI/bge-m3"),
        ("BAAI/bge-m3:fast", False, "BAAI/bge-m3:fast"),
        ("baai/BGE-M3", False, "BAAI/bge-m3"),
        ("Qwen__Qwen3-4B", True, "Qwen/Qwen3-4B"),
        ("Qwen__Qwen3-4B:fast", True, "Qwen/Qwen3-4B:fast"),
        ("qwen__qwen3-4b", True, "Qwen/Qwen3-4B"),
        ("Qwen/Qwen3-4B", True, "Qwen/Qwen3-4B"),  # the slash form works for generate too
        ("Qwen__Qwen3-4B", False, None),  # only generate writes '/' as '__'
        ("org/a__b", True, "org/a__b"),  # the exact id first
        ("BAAI/bge-m3:slow", False, None),
        ("nobody/knows", False, None),
    ],
)
def test_a_path_resolves_as_sie_resolves_it(
    asked: str, generate: bool, expected: str | None
) -> None:
    assert resolve_model_id(asked, KNOWN, generate=generate) == expected


def test_a_case_insensitive_match_must_be_unique_else_it_names_the_candidates() -> None:
    with pytest.raises(AmbiguousModel, match="'org/m' matches Org/M, org/M") as info:
        resolve_model_id("org/m", {"Org/M", "org/M"})
    assert (info.value.status, info.value.code) == (400, "ambiguous_model")
    assert resolve_model_id("org/M", {"Org/M", "org/M"}) == "org/M"


_SEGMENT = st.text(alphabet="abcXYZ019.-", min_size=1, max_size=8)


@given(st.lists(_SEGMENT, min_size=1, max_size=3))
def test_any_id_written_the_sdks_generate_way_comes_back(segments: list[str]) -> None:
    model = "/".join(segments)
    assert resolve_model_id(model.replace("/", "__"), {model}, generate=True) == model


@pytest.mark.parametrize(
    ("asked", "profile", "expected"),
    [
        ("m/x", None, "m/x"),
        ("m/x", "", "m/x"),
        ("m/x", "fast", "m/x:fast"),
        ("m/x", "default", "m/x"),
        ("m/x:fast", "fast", "m/x:fast"),
        ("m/x:fast", None, "m/x:fast"),
    ],
)
def test_a_profile_in_the_body_applies_to_a_path_that_names_none(
    asked: str, profile: str | None, expected: str
) -> None:
    assert with_profile(asked, profile) == expected


def test_two_different_profiles_are_refused_naming_the_field() -> None:
    with pytest.raises(InvalidRequest) as caught:
        with_profile("m/x:fast", "slow")
    assert caught.value.param == "options.profile"
    assert "'fast'" in caught.value.message
    assert "'slow'" in caught.value.message
