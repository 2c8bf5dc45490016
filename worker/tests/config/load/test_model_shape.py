"""Finding a model's config.json (local folder, package data, Hugging Face cache) and heads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sie_worker.config.files.reader import parse_config
from sie_worker.config.load.model_shape import (
    HeadCounts,
    ModelPathError,
    find_config_json,
    head_counts,
    hf_hub_cache,
    local_model_dir,
    width_fit_problems,
)
from sie_worker.config.model import ModelConfig

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def config(base_dir: Path | None = None, **top: Any) -> ModelConfig:
    doc = {
        "sie_id": "org/model",
        "hf_id": "org/model",
        "tasks": {"generate": {}},
        "profiles": {"default": {}},
        **top,
    }
    return parse_config(doc, source="m.yaml", base_dir=base_dir)


def cache_snapshot(hub: Path, revision: str, refs: dict[str, str], body: dict[str, Any]) -> Path:
    repo = hub / "models--org--model"
    for name, target in refs.items():
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / name).write_text(target + "\n")
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(body))
    return snapshot / "config.json"


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"HF_HUB_CACHE": "/a", "HF_HOME": "/b", "XDG_CACHE_HOME": "/c"}, "/a"),
        ({"HF_HOME": "/b", "XDG_CACHE_HOME": "/c"}, "/b/hub"),
        ({"XDG_CACHE_HOME": "/c"}, "/c/huggingface/hub"),
        ({"HF_HUB_CACHE": "", "HF_HOME": "/b"}, "/b/hub"),
    ],
)
def test_hub_cache_location_follows_huggingface_hub(env: dict[str, str], expected: str) -> None:
    assert hf_hub_cache(env) == Path(expected)


def test_hub_cache_defaults_to_the_home_cache() -> None:
    assert hf_hub_cache({}) == Path.home() / ".cache" / "huggingface" / "hub"


def test_config_json_is_found_through_refs_main(tmp_path: Path) -> None:
    expected = cache_snapshot(tmp_path, COMMIT, {"main": COMMIT}, {"num_attention_heads": 8})
    assert find_config_json(config(), {"HF_HUB_CACHE": str(tmp_path)}) == expected


def test_a_named_revision_reads_its_own_ref(tmp_path: Path) -> None:
    other = "f" * 40
    cache_snapshot(tmp_path, COMMIT, {"main": COMMIT}, {})
    expected = cache_snapshot(tmp_path, other, {"v2": other}, {})
    assert find_config_json(config(revision="v2"), {"HF_HUB_CACHE": str(tmp_path)}) == expected


def test_a_commit_revision_names_the_snapshot_directly(tmp_path: Path) -> None:
    expected = cache_snapshot(tmp_path, COMMIT, {}, {})
    assert find_config_json(config(revision=COMMIT), {"HF_HUB_CACHE": str(tmp_path)}) == expected


def test_hf_home_hub_is_searched(tmp_path: Path) -> None:
    expected = cache_snapshot(tmp_path / "hub", COMMIT, {"main": COMMIT}, {})
    assert find_config_json(config(), {"HF_HOME": str(tmp_path)}) == expected


@pytest.mark.parametrize("ref", ["", "../../etc", ".hidden"])
def test_odd_refs_find_nothing(tmp_path: Path, ref: str) -> None:
    cache_snapshot(tmp_path, COMMIT, {"main": ref}, {})
    assert find_config_json(config(), {"HF_HUB_CACHE": str(tmp_path)}) is None


def test_nothing_cached_finds_nothing(tmp_path: Path) -> None:
    assert find_config_json(config(), {"HF_HUB_CACHE": str(tmp_path)}) is None
    assert head_counts(config(), {"HF_HUB_CACHE": str(tmp_path)}) is None


def test_a_local_model_dir_wins_over_the_cache(tmp_path: Path) -> None:
    cache_snapshot(tmp_path / "hub", COMMIT, {"main": COMMIT}, {"num_attention_heads": 1})
    weights = tmp_path / "models" / "w"
    weights.mkdir(parents=True)
    (weights / "config.json").write_text(json.dumps({"num_attention_heads": 6}))
    model = config(base_dir=tmp_path / "models", model_path="w")
    counts = head_counts(model, {"HF_HUB_CACHE": str(tmp_path / "hub")})
    assert counts == HeadCounts(6, 6, weights / "config.json")


def test_relative_model_path_resolves_against_the_config_folder(tmp_path: Path) -> None:
    (tmp_path / "w").mkdir()
    assert local_model_dir(config(base_dir=tmp_path, model_path="./w")) == tmp_path / "w"


def test_relative_model_path_without_a_file_is_refused() -> None:
    with pytest.raises(ModelPathError, match="relative but the config has no file"):
        local_model_dir(config(model_path="w"))


def test_package_model_path_resolves_inside_the_installed_package() -> None:
    path = local_model_dir(config(model_path="package:sie_worker/config/data"))
    assert path is not None
    assert (path / "sglang-options-0.5.23.json").is_file()


def test_package_model_path_of_a_missing_package_is_refused() -> None:
    with pytest.raises(ModelPathError, match="is not installed"):
        local_model_dir(config(model_path="package:no_such_package_here/model"))


def test_missing_local_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelPathError, match="is not a directory"):
        local_model_dir(config(model_path=str(tmp_path / "nope")))


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"num_attention_heads": 32, "num_key_value_heads": 8}, (32, 8)),
        ({"num_attention_heads": 32}, (32, 32)),
        ({"n_head": 16, "n_head_kv": 1}, (16, 1)),
        (
            {
                "num_attention_heads": 16,
                "text_config": {"num_attention_heads": 28, "num_key_value_heads": 4},
            },
            (28, 4),
        ),
        (
            {
                "vision_config": {},
                "llm_config": {"num_attention_heads": 40, "num_key_value_heads": 8},
            },
            (40, 8),
        ),
        ({"num_attention_heads": True}, None),
        ({"num_attention_heads": "32"}, None),
        ([], None),
    ],
)
def test_head_counts_come_from_the_text_model(
    tmp_path: Path, body: Any, expected: tuple[int, int] | None
) -> None:
    (tmp_path / "config.json").write_text(json.dumps(body))
    counts = head_counts(config(model_path=str(tmp_path)))
    assert (None if counts is None else (counts.attention_heads, counts.kv_heads)) == expected


def test_unparsable_config_json_skips_the_check(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    assert head_counts(config(model_path=str(tmp_path))) is None


@pytest.mark.parametrize(
    ("heads", "kv", "fitting"),
    [
        (32, 8, [1, 2, 4, 8]),
        (28, 4, [1, 2, 4]),
        (14, 2, [1, 2]),
        (40, 8, [1, 2, 4, 8]),
        (12, 12, [1, 2, 3, 4, 6]),
        (32, 6, [1, 2]),
    ],
)
def test_width_fit_lists_the_widths_that_fit(heads: int, kv: int, fitting: list[int]) -> None:
    counts = HeadCounts(heads, kv, Path("config.json"))
    fits = [w for w in range(1, 9) if not width_fit_problems(w, counts)]
    assert fits == fitting
    for width in set(range(1, 9)) - set(fitting):
        messages = width_fit_problems(width, counts)
        assert messages
        assert all(
            f"widths that fit this model: {', '.join(map(str, fitting))}" in m for m in messages
        )
