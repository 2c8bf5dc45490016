"""The cache keyed on an engine's selection of weight files: a GGUF repo fetched for one
file is not complete for another of the same commit, and each is found again offline."""

from __future__ import annotations

from pathlib import Path

import huggingface_hub
import pytest
from tests.support.fake_hub import FakeHub, fetched_files, gguf_repo_files

from sie_worker.worker.weights.cache import HubSettings, SnapshotKey, cached_snapshot
from sie_worker.worker.weights.download import fetch_snapshot
from sie_worker.worker.weights.hub_errors import DownloadFailed

REPO = "org/tiny-gguf"


def _hub(hub: FakeHub, tmp_path: Path, *, offline: bool = False) -> HubSettings:
    return HubSettings(tmp_path / "hub", hub.url, offline=offline)


def test_a_key_shows_its_selection() -> None:
    assert str(SnapshotKey(REPO)) == f"{REPO}@main"
    assert str(SnapshotKey.of(REPO, None, ("a.gguf",))) == f"{REPO}@main [a.gguf]"


def test_two_gguf_files_of_one_commit_are_fetched_and_trusted_separately(
    hub: FakeHub, tmp_path: Path
) -> None:
    commit = hub.add_repo(REPO, gguf_repo_files())
    q4, q8 = (
        SnapshotKey(REPO, weights=("tiny-Q4_K_M.gguf",)),
        SnapshotKey(REPO, weights=("tiny-Q8_0.gguf",)),
    )
    first = fetch_snapshot(q4, _hub(hub, tmp_path))
    assert set(first.files) == {"config.json", "tiny-Q4_K_M.gguf"}
    assert sorted(fetched_files(hub, REPO)) == ["config.json", "tiny-Q4_K_M.gguf"]
    # The commit's snapshot is complete for Q4, not for Q8 (nor for the usual choice).
    assert cached_snapshot(q8, _hub(hub, tmp_path)) is None
    assert cached_snapshot(SnapshotKey(REPO), _hub(hub, tmp_path)) is None
    hub.requests.clear()
    second = fetch_snapshot(q8, _hub(hub, tmp_path))
    assert (second.commit, second.path) == (commit, first.path)
    assert set(second.files) == {"config.json", "tiny-Q8_0.gguf"}
    assert fetched_files(hub, REPO) == ["tiny-Q8_0.gguf"]  # config.json was there already
    hub.stop()
    for key, name in ((q4, "tiny-Q4_K_M.gguf"), (q8, "tiny-Q8_0.gguf")):
        found = cached_snapshot(key, _hub(hub, tmp_path, offline=True))
        assert found is not None
        assert found.cached
        assert set(found.files) == {"config.json", name}


def test_a_removed_selected_file_makes_only_its_selection_incomplete(
    hub: FakeHub, tmp_path: Path
) -> None:
    hub.add_repo(REPO, gguf_repo_files())
    q4, q8 = (
        SnapshotKey(REPO, weights=("tiny-Q4_K_M.gguf",)),
        SnapshotKey(REPO, weights=("tiny-Q8_0.gguf",)),
    )
    fetch_snapshot(q4, _hub(hub, tmp_path))
    snapshot = fetch_snapshot(q8, _hub(hub, tmp_path))
    (snapshot.path / "tiny-Q8_0.gguf").unlink()
    assert cached_snapshot(q8, _hub(hub, tmp_path)) is None
    assert cached_snapshot(q4, _hub(hub, tmp_path)) is not None


def test_a_selection_the_repo_lacks_names_its_gguf_files_and_the_fix(
    hub: FakeHub, tmp_path: Path
) -> None:
    hub.add_repo(REPO, gguf_repo_files())
    key = SnapshotKey(REPO, weights=("tiny-Q5_K_M.gguf",))
    with pytest.raises(DownloadFailed) as failed:
        fetch_snapshot(key, _hub(hub, tmp_path))
    assert failed.value.message == (
        f"{REPO}@main [tiny-Q5_K_M.gguf] has no tiny-Q5_K_M.gguf (the weights its engine "
        "takes); its .gguf files: tiny-Q4_K_M.gguf, tiny-Q8_0.gguf; name one of its files in "
        "the profile's adapter_options.loadtime, or point hf_id at a repo that holds it"
    )
    assert fetched_files(hub, REPO) == []


def test_a_gguf_repo_prepared_with_hf_download_is_trusted_for_its_file(
    hub: FakeHub, tmp_path: Path
) -> None:
    commit = hub.add_repo(REPO, gguf_repo_files())
    huggingface_hub.snapshot_download(REPO, cache_dir=tmp_path / "hub", endpoint=hub.url)
    key = SnapshotKey(REPO, weights=("tiny-Q8_0.gguf",))
    found = cached_snapshot(key, _hub(hub, tmp_path, offline=True))
    assert found is not None
    assert (found.commit, set(found.files)) == (commit, {"config.json", "tiny-Q8_0.gguf"})
