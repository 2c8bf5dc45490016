"""Which served model an SIE path names."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sie_worker.errors import AmbiguousModel, InvalidRequest
from sie_worker.sie_api.ids import resolve_model_id, split_model, with_profile

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


IDS = ("org/m", "org/m:fast", "s3://bucket/m")


def test_a_served_id_as_written_is_never_split() -> None:
    assert split_model("org/m:fast", IDS) is None  # a profile, not an adapter
    assert split_model("org/m", IDS) is None
    assert split_model("s3://bucket/m", IDS) is None


def test_the_longest_served_id_before_a_colon_is_the_base() -> None:
    assert split_model("org/m:sql", IDS) == ("org/m", "sql")
    assert split_model("org/m:fast:sql", IDS) == ("org/m:fast", "sql")
    assert split_model("s3://bucket/m:sql", IDS) == ("s3://bucket/m", "sql")


def test_no_base_or_no_adapter_is_no_split() -> None:
    assert split_model("other:sql", IDS) is None
    assert split_model("org/m:", IDS) is None
    assert split_model("org/m: ", IDS) is None


@given(
    base=st.sampled_from(IDS),
    adapter=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,20}", fullmatch=True),
)
def test_base_colon_adapter_always_splits_back(base: str, adapter: str) -> None:
    named = f"{base}:{adapter}"
    if named in IDS:
        return
    split = split_model(named, IDS)
    assert split is not None
    assert f"{split[0]}:{split[1]}" == named
    assert split[0] in IDS
