"""Which repo files are fetched, when a cached snapshot is trusted, and progress arithmetic."""

from __future__ import annotations

import json
from fnmatch import fnmatch

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sie_worker.worker.weights.files import (
    EXCLUDED_FOLDERS,
    SUPPORT_PATTERNS,
    NoWeights,
    bytes_done,
    bytes_total,
    index_shards,
    is_commit,
    is_offline,
    marker_text,
    missing_files,
    parse_marker,
    plan_files,
    repo_folder,
    weight_files,
)

COMMIT = "a" * 40
LLAMA_REPO = [
    ".gitattributes",
    "LICENSE",
    "README.md",
    "config.json",
    "generation_config.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    "model.safetensors.index.json",
    "original/consolidated.00.pth",
    "original/params.json",
    "original/tokenizer.model",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
]


def _selected(files: list[str], shards: list[str] | None = None) -> tuple[str, ...]:
    plan = plan_files(files)
    return (*plan.support, *weight_files(plan, files, shards or []))


def test_a_sharded_llama_repo_fetches_configs_tokenizer_index_and_the_named_shards() -> None:
    plan = plan_files(LLAMA_REPO)
    assert plan.format.name == "safetensors"
    assert plan.index == "model.safetensors.index.json"
    assert plan.weights is None  # the shards come from the index
    assert plan.support == (
        "config.json",
        "generation_config.json",
        "model.safetensors.index.json",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    )
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert weight_files(plan, LLAMA_REPO, shards) == tuple(shards)


def test_the_original_checkpoint_and_other_runtimes_folders_are_never_fetched() -> None:
    files = [*LLAMA_REPO, "onnx/model.onnx", "onnx/config.json", "openvino/openvino_model.xml"]
    selected = _selected(files, ["model-00001-of-00002.safetensors"])
    assert not [f for f in selected if f.split("/")[0] in EXCLUDED_FOLDERS]


def test_safetensors_win_over_pytorch_pickles_and_both_are_never_fetched() -> None:
    files = ["config.json", "model.safetensors", "pytorch_model.bin", "tokenizer.json"]
    assert _selected(files) == ("config.json", "tokenizer.json", "model.safetensors")


def test_a_repo_with_only_pytorch_weights_fetches_them_by_their_index() -> None:
    files = [
        "config.json",
        "pytorch_model-00001-of-00002.bin",
        "pytorch_model-00002-of-00002.bin",
        "pytorch_model.bin.index.json",
        "training_args.bin",
    ]
    plan = plan_files(files)
    assert (plan.format.name, plan.index) == ("PyTorch", "pytorch_model.bin.index.json")
    named = ["pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin"]
    assert weight_files(plan, files, named) == tuple(named)
    assert "training_args.bin" not in (*plan.support, *named)


def test_an_index_keeps_mistrals_consolidated_file_out() -> None:
    files = [
        "config.json",
        "consolidated.safetensors",
        "model-00001-of-00001.safetensors",
        "model.safetensors.index.json",
    ]
    assert _selected(files, ["model-00001-of-00001.safetensors"])[-1:] == (
        "model-00001-of-00001.safetensors",
    )


def test_without_an_index_consolidated_files_go_when_others_exist() -> None:
    files = ["config.json", "consolidated.safetensors", "model.safetensors"]
    assert plan_files(files).weights == ("model.safetensors",)
    assert plan_files(["config.json", "consolidated.safetensors"]).weights == (
        "consolidated.safetensors",
    )


def test_sentence_transformers_modules_keep_their_folders() -> None:
    files = [
        "1_Pooling/config.json",
        "2_Dense/config.json",
        "2_Dense/model.safetensors",
        "config.json",
        "config_sentence_transformers.json",
        "model.safetensors",
        "modules.json",
        "sentence_bert_config.json",
        "vocab.txt",
    ]
    assert set(_selected(files)) == set(files)


def test_remote_code_and_tokenizer_formats_are_support_files() -> None:
    files = ["configuration_x.py", "modeling_x.py", "tokenizer.model", "qwen.tiktoken",
             "chat_template.jinja", "merges.txt", "model.safetensors"]  # fmt: skip
    assert set(plan_files(files).support) == set(files) - {"model.safetensors"}


def test_an_index_naming_shards_in_its_own_folder_resolves_them_there() -> None:
    files = ["config.json", "sub/model.safetensors.index.json", "sub/a.safetensors"]
    plan = plan_files(files)
    assert plan.index is None  # only a top-level index counts as the model's
    assert plan.weights == ("sub/a.safetensors",)


def test_an_index_that_names_no_present_shard_is_refused() -> None:
    plan = plan_files(LLAMA_REPO)
    with pytest.raises(NoWeights, match="names no shard"):
        weight_files(plan, LLAMA_REPO, ["model-9-of-9.safetensors"])


def test_a_repo_without_loadable_weights_is_refused_naming_what_it_holds() -> None:
    with pytest.raises(NoWeights, match=r"\*\.safetensors, pytorch_model\*\.bin.*\*\.gguf"):
        plan_files(["README.md", "model-q4.gguf", "config.json"])


_NAMES = st.sampled_from(
    [
        "config.json",
        "a.safetensors",
        "b.safetensors",
        "pytorch_model.bin",
        "tokenizer.model",
        "x.py",
        "README.md",
        "model.onnx",
        "consolidated.safetensors",
        "merges.txt",
        "w.gguf",
        "model.safetensors.index.json",
    ]
)
_FOLDERS = st.sampled_from(["", "original/", "onnx/", "2_Dense/", ".cache/", "sub/deeper/"])
_REPOS = st.lists(st.builds(lambda d, n: d + n, _FOLDERS, _NAMES), max_size=20, unique=True)


def _visible(path: str) -> bool:
    return not any(p in EXCLUDED_FOLDERS or p.startswith(".") for p in path.split("/")[:-1])


@given(_REPOS, st.lists(_NAMES, max_size=4))
def test_every_selection_is_one_format_outside_excluded_folders(
    files: list[str], shards: list[str]
) -> None:
    visible = [f for f in files if _visible(f)]
    safetensors = [f for f in visible if fnmatch(f.split("/")[-1], "*.safetensors")]
    pickles = [f for f in visible if fnmatch(f.split("/")[-1], "pytorch_model*.bin")]
    try:
        plan = plan_files(files)
        chosen = (*plan.support, *weight_files(plan, files, shards))
    except NoWeights:
        named = set(shards) & set(safetensors or pickles)
        index = "model.safetensors.index.json" if safetensors else "pytorch_model.bin.index.json"
        assert not (safetensors or pickles) or (index in files and not named)
        return
    assert set(chosen) <= set(visible)
    assert len(set(chosen)) == len(chosen)
    weights = [f for f in chosen if f not in plan.support]
    assert weights
    assert set(weights) <= set(safetensors if plan.format.name == "safetensors" else pickles)
    assert set(weights) <= set(safetensors) or set(weights) <= set(pickles)
    # Every support-pattern file outside excluded folders is fetched.
    for path in visible:
        if path not in weights and any(fnmatch(path.split("/")[-1], p) for p in SUPPORT_PATTERNS):
            assert path in chosen


def test_index_shards_reads_the_weight_map_and_ignores_malformed_ones() -> None:
    index = {"weight_map": {"a": "x.safetensors", "b": "y.safetensors", "c": "x.safetensors"}}
    assert index_shards(index) == {"x.safetensors", "y.safetensors"}
    for bad in (None, [], {"weight_map": []}, {"weight_map": {"a": 3}}, {}):
        assert index_shards(bad) == frozenset()


# --- trust -----------------------------------------------------------------------------


def test_a_file_missing_or_of_another_size_makes_the_snapshot_incomplete() -> None:
    expected = {"config.json": 10, "model.safetensors": 100, "x.py": None}
    assert missing_files(expected, {"config.json": 10, "model.safetensors": 100, "x.py": 3}) == []
    assert missing_files(expected, {"config.json": 10, "x.py": 3}) == ["model.safetensors"]
    assert missing_files(expected, {"config.json": 10, "model.safetensors": 99, "x.py": 1}) == [
        "model.safetensors"
    ]


@given(
    st.dictionaries(st.sampled_from(list("abcdef")), st.none() | st.integers(0, 9), max_size=6),
    st.dictionaries(st.sampled_from(list("abcdefg")), st.none() | st.integers(0, 9), max_size=7),
)
def test_missing_files_is_exactly_the_absent_or_resized_ones(
    expected: dict[str, int | None], present: dict[str, int | None]
) -> None:
    missing = set(missing_files(expected, present))
    for path, size in expected.items():
        ok = path in present and (size is None or present[path] == size)
        assert (path in missing) is not ok


def test_a_completion_record_round_trips_and_names_its_commit_and_repo() -> None:
    files = {"config.json": 10, "model.safetensors": 100}
    text = marker_text("org/m", COMMIT, files)
    assert parse_marker(text, "org/m", COMMIT) == files
    assert parse_marker(text, "org/other", COMMIT) is None
    assert parse_marker(text, "org/m", "b" * 40) is None


@pytest.mark.parametrize(
    "files",
    [{}, {"../escape": 1}, {"/abs": 1}, {"a//b": 1}, {"a": -1}, {"a": True}, {"a": "1"}, []],
)
def test_a_tampered_or_empty_completion_record_is_not_trusted(files: object) -> None:
    text = json.dumps({"repo_id": "org/m", "commit": COMMIT, "files": files})
    assert parse_marker(text, "org/m", COMMIT) is None


def test_a_record_that_is_not_json_is_not_trusted() -> None:
    assert parse_marker("{half", "org/m", COMMIT) is None


@pytest.mark.parametrize(
    ("env", "offline"),
    [
        ({}, False),
        ({"HF_HUB_OFFLINE": "1"}, True),
        ({"HF_HUB_OFFLINE": "true"}, True),
        ({"HF_HUB_OFFLINE": " YES "}, True),
        ({"HF_HUB_OFFLINE": "0"}, False),
        ({"HF_HUB_OFFLINE": ""}, False),
        ({"TRANSFORMERS_OFFLINE": "1"}, True),
        ({"HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "1"}, False),
    ],
)
def test_offline_reads_as_huggingface_hub_does(env: dict[str, str], offline: bool) -> None:
    assert is_offline(env) is offline


def test_commits_and_cache_folders() -> None:
    assert is_commit(COMMIT)
    assert not is_commit("main")
    assert not is_commit("A" * 40)
    assert repo_folder("org/name") == "models--org--name"


# --- progress --------------------------------------------------------------------------


def test_bytes_done_are_capped_per_file_and_the_total_waits_for_every_size() -> None:
    sizes = {"a": 10, "b": 20}
    assert bytes_done(sizes, {"a": 15, "b": 5}) == 15
    assert bytes_done(sizes, {"a": -3}) == 0
    assert bytes_done(sizes, {"zzz": 99}) == 0
    assert bytes_total(sizes) == 30
    assert bytes_total({"a": 10, "b": None}) is None
    assert bytes_total({}) == 0


@given(
    st.dictionaries(st.sampled_from(list("abcde")), st.integers(0, 1000), max_size=5),
    st.dictionaries(st.sampled_from(list("abcdef")), st.integers(-10, 2000), max_size=6),
)
def test_progress_never_passes_the_total(sizes: dict[str, int], done: dict[str, int]) -> None:
    total = bytes_total(sizes)
    assert total is not None
    assert 0 <= bytes_done(sizes, done) <= total
    assert bytes_done(sizes, dict(sizes)) == total
