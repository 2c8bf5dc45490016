"""The weights shell against a fake hub: downloads, resumes, trust, errors, cancellation."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Callable
from pathlib import Path

import huggingface_hub
import pytest
from tests.support.fake_hub import FakeHub, fetched_files, synthetic_model_files

from sie_worker.worker.weights import download
from sie_worker.worker.weights.cache import HubSettings, SnapshotKey, cached_snapshot
from sie_worker.worker.weights.download import fetch_snapshot
from sie_worker.worker.weights.hub_errors import DownloadCancelled, DownloadFailed
from sie_worker.worker.weights.progress import Progress
from sie_worker.worker.weights.shared import SnapshotDownloads

REPO = "org/tiny"
SELECTED = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}


def settings(hub: FakeHub, tmp_path: Path, **changes: object) -> HubSettings:
    base = HubSettings(tmp_path / "hub", hub.url)
    return HubSettings(**{**base.__dict__, **changes})  # type: ignore[arg-type]


def test_a_download_fetches_only_what_engines_need_and_marks_the_snapshot_complete(
    hub: FakeHub, tmp_path: Path
) -> None:
    commit = hub.add_repo(REPO, synthetic_model_files())
    progress = Progress()
    snapshot = fetch_snapshot(SnapshotKey(REPO), settings(hub, tmp_path), progress)
    assert snapshot.path == tmp_path / "hub" / "models--org--tiny" / "snapshots" / commit
    assert set(snapshot.files) == SELECTED
    assert sorted(fetched_files(hub, REPO)) == sorted(SELECTED)  # each once, nothing else
    assert (snapshot.path / "model.safetensors").read_bytes() == synthetic_model_files()[
        "model.safetensors"
    ]
    assert progress.done == progress.total == sum(snapshot.files.values())  # type: ignore[arg-type]
    assert (tmp_path / "hub" / "models--org--tiny" / "refs" / "main").read_text() == commit
    assert not snapshot.cached


def test_a_complete_snapshot_is_used_again_without_any_request(
    hub: FakeHub, tmp_path: Path
) -> None:
    hub.add_repo(REPO, synthetic_model_files())
    first = fetch_snapshot(SnapshotKey(REPO), settings(hub, tmp_path))
    hub.requests.clear()
    hub.stop()  # no endpoint at all
    again = fetch_snapshot(SnapshotKey(REPO), settings(hub, tmp_path))
    offline = fetch_snapshot(SnapshotKey(REPO), settings(hub, tmp_path, offline=True))
    assert again.path == offline.path == first.path
    assert again.cached
    assert offline.cached
    assert hub.requests == []


def test_a_pinned_commit_is_found_in_the_cache_without_a_ref(hub: FakeHub, tmp_path: Path) -> None:
    commit = hub.add_repo(REPO, synthetic_model_files())
    fetch_snapshot(SnapshotKey(REPO, commit), settings(hub, tmp_path))
    assert not (tmp_path / "hub" / "models--org--tiny" / "refs").exists()
    assert cached_snapshot(SnapshotKey(REPO, commit), settings(hub, tmp_path)) is not None
    assert cached_snapshot(SnapshotKey(REPO), settings(hub, tmp_path)) is None


def test_a_dropped_connection_resumes_from_where_it_stopped(hub: FakeHub, tmp_path: Path) -> None:
    files = synthetic_model_files(weights_bytes=24 << 20)
    hub.add_repo(REPO, files)
    hub.drop(REPO, "model.safetensors", after_bytes=15 << 20)
    snapshot = fetch_snapshot(SnapshotKey(REPO), settings(hub, tmp_path))
    got = (snapshot.path / "model.safetensors").read_bytes()
    assert hashlib.sha256(got).digest() == hashlib.sha256(files["model.safetensors"]).digest()  # type: ignore[arg-type]
    ranges = [r.range for r in hub.gets(REPO) if r.path.endswith("model.safetensors")]
    assert ranges[0] is None
    resumed = int(ranges[1].removeprefix("bytes=").rstrip("-"))
    assert (14 << 20) < resumed <= (15 << 20)  # what had arrived was kept, up to a chunk


def test_an_interrupted_download_is_never_trusted_and_resumes_from_the_files_it_has(
    hub: FakeHub, tmp_path: Path
) -> None:
    hub.add_repo(REPO, synthetic_model_files(shards=3))
    shard = "model-00002-of-00003.safetensors"
    hub.drop(REPO, shard, after_bytes=1000, times=10)  # every retry fails
    with pytest.raises(DownloadFailed, match="could not download"):
        fetch_snapshot(SnapshotKey(REPO), settings(hub, tmp_path))
    assert cached_snapshot(SnapshotKey(REPO), settings(hub, tmp_path)) is None
    assert not list((tmp_path / "hub").rglob("*.incomplete"))
    with pytest.raises(
        DownloadFailed, match=r"HF_HUB_OFFLINE is set and the model cache .* only an incomplete"
    ):
        fetch_snapshot(SnapshotKey(REPO), settings(hub, tmp_path, offline=True))

    hub.drop(REPO, shard, after_bytes=0, times=0)
    hub.requests.clear()
    fetch_snapshot(SnapshotKey(REPO), settings(hub, tmp_path))
    assert fetched_files(hub, REPO) == [shard]  # only what was missing


def test_a_gated_repo_names_401_and_the_token_and_works_with_the_right_token(
    hub: FakeHub, tmp_path: Path
) -> None:
    hub.add_repo(REPO, synthetic_model_files(), gated_token="hf_right")
    with pytest.raises(DownloadFailed) as no_token:
        fetch_snapshot(SnapshotKey(REPO), settings(hub, tmp_path))
    assert "401 Unauthorized" in no_token.value.message
    assert "gated and HF_TOKEN is not set" in no_token.value.message
    assert "workers.common.hfToken" in no_token.value.message
    with pytest.raises(DownloadFailed, match=r"401 .* HF_TOKEN account has no access"):
        fetch_snapshot(SnapshotKey(REPO), settings(hub, tmp_path, token="hf_wrong"))
    snapshot = fetch_snapshot(SnapshotKey(REPO), settings(hub, tmp_path, token="hf_right"))
    assert set(snapshot.files) == SELECTED
    assert {r.authorization for r in hub.gets(REPO)} >= {"Bearer hf_right"}


@pytest.mark.parametrize(
    ("key", "fragment"),
    [
        (SnapshotKey("org/missing"), "404 Not Found from .*: no such repo; check hf_id"),
        (SnapshotKey(REPO, "v9"), "404 Not Found .* no revision 'v9'; fix revision"),
    ],
)
def test_a_missing_repo_or_revision_names_404_and_what_to_fix(
    hub: FakeHub, tmp_path: Path, key: SnapshotKey, fragment: str
) -> None:
    hub.add_repo(REPO, synthetic_model_files())
    with pytest.raises(DownloadFailed, match=fragment):
        fetch_snapshot(key, settings(hub, tmp_path))


def test_an_unreachable_endpoint_says_so_and_names_it(hub: FakeHub, tmp_path: Path) -> None:
    hub.stop()
    with pytest.raises(DownloadFailed, match=f"could not download from {hub.url}.*HF_ENDPOINT"):
        fetch_snapshot(SnapshotKey(REPO), settings(hub, tmp_path))


def test_offline_without_the_model_in_the_cache_names_the_fix(tmp_path: Path) -> None:
    hub = HubSettings(tmp_path / "hub", "http://127.0.0.1:9", offline=True)
    with pytest.raises(DownloadFailed, match=r"not in the model cache .*sie-worker fetch"):
        fetch_snapshot(SnapshotKey(REPO), hub)


def test_a_repo_without_loadable_weights_is_refused(hub: FakeHub, tmp_path: Path) -> None:
    hub.add_repo(REPO, {"config.json": b"{}", "model.gguf": b"x" * 100})
    with pytest.raises(DownloadFailed, match=r"no weights the engines load .*\*\.gguf"):
        fetch_snapshot(SnapshotKey(REPO), settings(hub, tmp_path))
    assert fetched_files(hub, REPO) == []


def test_too_little_room_in_the_cache_is_refused_before_the_weights_download(
    hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub.add_repo(REPO, synthetic_model_files())

    class Usage:
        free = 1000

    monkeypatch.setattr(download.shutil, "disk_usage", lambda _: Usage)
    with pytest.raises(DownloadFailed, match=r"need 0\.0 GB but the model cache .* 0\.0 GB free"):
        fetch_snapshot(SnapshotKey(REPO), settings(hub, tmp_path))
    assert "model.safetensors" not in fetched_files(hub, REPO)


def test_a_cache_prepared_with_hf_download_is_trusted(hub: FakeHub, tmp_path: Path) -> None:
    commit = hub.add_repo(REPO, synthetic_model_files())
    huggingface_hub.snapshot_download(REPO, cache_dir=tmp_path / "hub", endpoint=hub.url)
    snapshot = cached_snapshot(SnapshotKey(REPO), settings(hub, tmp_path, offline=True))
    assert snapshot is not None
    assert (snapshot.commit, set(snapshot.files)) == (commit, SELECTED)


def test_a_cancelled_download_stops_its_threads_and_leaves_nothing_trusted(
    hub: FakeHub, tmp_path: Path
) -> None:
    hub.add_repo(REPO, synthetic_model_files(weights_bytes=40 << 20))
    hub.bytes_per_s = 4 << 20  # ten seconds for the weights

    async def scenario() -> None:
        downloads = SnapshotDownloads(settings(hub, tmp_path))
        handle = downloads.join(SnapshotKey(REPO))
        waiter = asyncio.ensure_future(handle.result())
        await _until(lambda: handle.progress.done >= 1 << 20)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert handle._download.future.done()  # the thread ended before the waiter did
        assert isinstance(handle._download.future.exception(), DownloadCancelled)
        await downloads.aclose()

    asyncio.run(scenario())
    assert cached_snapshot(SnapshotKey(REPO), settings(hub, tmp_path)) is None
    assert not list((tmp_path / "hub").rglob("*.incomplete"))
    ours = [
        t.name for t in threading.enumerate() if t.name.startswith(("sie-download", "sie-fetch"))
    ]
    assert ours == []


def test_loads_of_one_snapshot_share_one_download(hub: FakeHub, tmp_path: Path) -> None:
    hub.add_repo(REPO, synthetic_model_files(weights_bytes=4 << 20))
    hub.bytes_per_s = 8 << 20

    async def scenario() -> None:
        downloads = SnapshotDownloads(settings(hub, tmp_path))
        first, second = downloads.join(SnapshotKey(REPO)), downloads.join(SnapshotKey(REPO))
        assert first.progress is second.progress
        one, two = await asyncio.gather(first.result(), second.result())
        assert one is two
        await downloads.aclose()

    asyncio.run(scenario())
    assert sorted(fetched_files(hub, REPO)) == sorted(SELECTED)


def test_one_cancelled_waiter_does_not_stop_a_shared_download(hub: FakeHub, tmp_path: Path) -> None:
    hub.add_repo(REPO, synthetic_model_files(weights_bytes=4 << 20))
    hub.bytes_per_s = 8 << 20

    async def scenario() -> None:
        downloads = SnapshotDownloads(settings(hub, tmp_path))
        leaving, staying = downloads.join(SnapshotKey(REPO)), downloads.join(SnapshotKey(REPO))
        waiter = asyncio.ensure_future(leaving.result())
        await asyncio.sleep(0.1)
        waiter.cancel()
        snapshot = await staying.result()
        assert set(snapshot.files) == SELECTED
        await downloads.aclose()

    asyncio.run(scenario())


async def _until(condition: Callable[[], bool]) -> None:
    for _ in range(600):
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not met within 30 s")


def test_hub_settings_come_from_the_environment(tmp_path: Path) -> None:
    hub = HubSettings.from_env(
        {"HF_HOME": str(tmp_path), "HF_ENDPOINT": "http://mirror:8080/", "HF_TOKEN": " t "}
    )
    assert hub == HubSettings(tmp_path / "hub", "http://mirror:8080", "t", False)
    assert HubSettings.from_env({"HF_HUB_CACHE": "/c", "HF_HUB_OFFLINE": "1"}).offline
    assert HubSettings.from_env({}).endpoint == "https://huggingface.co"
