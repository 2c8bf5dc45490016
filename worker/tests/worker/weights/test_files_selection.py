"""An engine's own selection of weight files (llama.cpp's ``gguf_file``): exactly those files
and the support files, a split GGUF with all its parts, one completion record per selection."""

from __future__ import annotations

from fnmatch import fnmatchcase

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sie_worker.worker.weights.files import (
    EXCLUDED_FOLDERS,
    SUPPORT_PATTERNS,
    NoWeights,
    marker_name,
    marker_text,
    parse_marker,
    plan_files,
    weight_files,
)

COMMIT = "c" * 40
GGUF_REPO = [
    ".gitattributes",
    "README.md",
    "config.json",
    "tokenizer.json",
    "model.safetensors",
    "tiny-Q4_K_M.gguf",
    "tiny-Q8_0.gguf",
    "big/tiny-F16-00001-of-00003.gguf",
    "big/tiny-F16-00002-of-00003.gguf",
    "big/tiny-F16-00003-of-00003.gguf",
    "gguf/other.gguf",
]


def _chosen(files: list[str], *selection: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    plan = plan_files(files, selection)
    return plan.support, weight_files(plan, files, [])


def test_a_named_gguf_file_brings_only_itself_and_the_support_files() -> None:
    support, weights = _chosen(GGUF_REPO, "tiny-Q8_0.gguf")
    assert weights == ("tiny-Q8_0.gguf",)
    assert support == ("config.json", "tokenizer.json")  # no README, no other weights


def test_the_first_part_of_a_split_gguf_brings_every_part() -> None:
    _, weights = _chosen(GGUF_REPO, "big/tiny-F16-00001-of-00003.gguf")
    assert weights == tuple(f"big/tiny-F16-0000{k}-of-00003.gguf" for k in (1, 2, 3))


def test_a_split_gguf_missing_a_part_is_refused_naming_it() -> None:
    files = [f for f in GGUF_REPO if "00002-of" not in f]
    with pytest.raises(NoWeights, match=r"part 1 of 3.*lacks big/tiny-F16-00002-of-00003\.gguf"):
        plan_files(files, ["big/tiny-F16-00001-of-00003.gguf"])


def test_a_wildcard_takes_every_match_outside_excluded_folders() -> None:
    _, weights = _chosen(GGUF_REPO, "*.gguf")
    assert "gguf/other.gguf" not in weights
    assert {"tiny-Q4_K_M.gguf", "tiny-Q8_0.gguf"} <= set(weights)
    assert not [w for w in weights if not w.endswith(".gguf")]


def test_a_path_named_outright_is_taken_even_in_an_excluded_folder() -> None:
    _, weights = _chosen(GGUF_REPO, "gguf/other.gguf")
    assert weights == ("gguf/other.gguf",)


def test_a_selection_matching_nothing_is_refused_naming_the_repos_gguf_files() -> None:
    with pytest.raises(NoWeights) as refused:
        plan_files(GGUF_REPO, ["tiny-Q5_K_M.gguf"])
    message = str(refused.value)
    assert message.startswith("has no tiny-Q5_K_M.gguf")
    assert "tiny-Q4_K_M.gguf, tiny-Q8_0.gguf" in message


def test_a_repo_without_any_gguf_names_what_it_holds() -> None:
    with pytest.raises(NoWeights, match=r"has no \*\.gguf .*it holds \*\.json, \*\.safetensors"):
        plan_files(["config.json", "model.safetensors"], ["*.gguf"])


def test_the_usual_choice_is_unchanged_without_a_selection() -> None:
    plan = plan_files(GGUF_REPO)
    assert plan.format.name == "safetensors"
    assert weight_files(plan, GGUF_REPO, []) == ("model.safetensors",)


_NAMES = st.sampled_from(
    [
        "config.json",
        "tokenizer.json",
        "README.md",
        "a.safetensors",
        "pytorch_model.bin",
        "m-Q4.gguf",
        "m-Q8.gguf",
        "m-00001-of-00002.gguf",
        "m-00002-of-00002.gguf",
    ]
)
_FOLDERS = st.sampled_from(["", "sub/", "gguf/", ".cache/"])
_REPOS = st.lists(st.builds(lambda d, n: d + n, _FOLDERS, _NAMES), max_size=16, unique=True)
_SELECTIONS = st.lists(
    st.sampled_from(["*.gguf", "m-Q4.gguf", "sub/m-Q8.gguf", "m-00001-of-00002.gguf", "*Q8*"]),
    min_size=1,
    max_size=2,
    unique=True,
)


def _hidden(path: str) -> bool:
    parts = path.split("/")
    return any(p in EXCLUDED_FOLDERS or p.startswith(".") for p in parts[:-1])


@given(_REPOS, _SELECTIONS)
def test_a_selection_fetches_its_matches_and_the_support_files_and_nothing_else(
    files: list[str], selection: list[str]
) -> None:
    matched = {
        f
        for p in selection
        for f in files
        if (f == p) or (any(c in p for c in "*?[") and not _hidden(f) and fnmatchcase(f, p))
    }
    try:
        support, weights = _chosen(files, *selection)
    except NoWeights:
        split = {f for f in matched if "-00001-of-00002" in f}
        second = {f.replace("00001-of", "00002-of") for f in split}
        assert not matched or not second <= set(files)
        return
    assert matched <= set(weights) <= set(files)
    # Only the other parts of a selected split file come beside the matches.
    assert all(w in matched or "-of-00002" in w for w in weights)
    for path in files:
        wanted = not _hidden(path) and any(
            fnmatchcase(path.rsplit("/", 1)[-1], p) for p in SUPPORT_PATTERNS
        )
        assert (path in support) == (wanted and path not in weights)


def test_each_selection_has_its_own_completion_record() -> None:
    assert marker_name(COMMIT) == f"{COMMIT}.json"  # the usual choice: as before
    names = {marker_name(COMMIT, s) for s in [(), ("a.gguf",), ("b.gguf",), ("*.gguf",)]}
    assert len(names) == 4


def test_a_record_is_trusted_only_for_the_selection_it_was_written_for() -> None:
    files: dict[str, int | None] = {"config.json": 2, "a.gguf": 10}
    text = marker_text("org/m", COMMIT, files, ("a.gguf",))
    assert parse_marker(text, "org/m", COMMIT, ("a.gguf",)) == files
    assert parse_marker(text, "org/m", COMMIT, ("b.gguf",)) is None
    assert parse_marker(text, "org/m", COMMIT) is None
    plain = marker_text("org/m", COMMIT, files)
    assert "weights" not in plain
    assert parse_marker(plain, "org/m", COMMIT) == files
    assert parse_marker(plain, "org/m", COMMIT, ("a.gguf",)) is None
