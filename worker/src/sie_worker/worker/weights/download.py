"""Model weights in the Hugging Face cache: find a complete snapshot, or download one with
huggingface_hub, in a thread, cancellably, with byte progress.

The worker fetches a model's snapshot before it starts the engine and starts the engine
from the local folder (``--model-path <HF_HUB_CACHE>/models--org--name/snapshots/<commit>``);
``sie-worker fetch`` fetches the same way. What is fetched, and when a snapshot is trusted,
is :mod:`sie_worker.worker.weights.files` (pure); this module is the shell around the hub.

- A snapshot that is complete in the cache (a completion record whose files are all there)
  is used without any network request, also with ``HF_HUB_OFFLINE=1``. A cache prepared
  with ``hf download`` is trusted when huggingface_hub's own listing of the commit shows
  every selected file present.
- Otherwise (and never with ``HF_HUB_OFFLINE``/``TRANSFORMERS_OFFLINE``) the revision is
  resolved on ``HF_ENDPOINT`` with ``HF_TOKEN``, the support files and then the weights
  (the key's selection: an engine's own choice such as llama.cpp's GGUF file) are
  downloaded (8 files at a time; a dropped connection resumes from the byte it reached, a
  file that arrived earlier is not fetched again), every file is checked, and only then
  the completion record and ``refs/<revision>`` are written.
- Hub failures become :class:`DownloadFailed` (``load_failed``) saying what to do: 401
  gated or unauthorized, 404 repo/revision/file not found, network errors, no space.
- The cache and its trust rule are :mod:`.cache`, progress :mod:`.progress`,
  failure messages :mod:`.hub_errors`; :mod:`.shared` runs these fetches in
  threads, one per repo and revision, shared by the loads waiting for it.
"""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Mapping
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path

from sie_worker._version import __version__
from sie_worker.worker.weights.cache import (
    HubSettings,
    Snapshot,
    SnapshotKey,
    cached_snapshot,
    mark_complete,
    present_files,
    read_index,
    repo_path,
)
from sie_worker.worker.weights.files import is_commit, missing_files, plan_files, weight_files
from sie_worker.worker.weights.hub_errors import (
    DownloadCancelled,
    DownloadFailed,
    hub_errors,
    offline_message,
)
from sie_worker.worker.weights.progress import Progress, Stopped

__all__ = ["fetch_snapshot"]

_log = logging.getLogger("sie_worker.weights")
_FILES_AT_ONCE = 8  # as huggingface_hub's snapshot_download
# huggingface_hub reads plain-HTTP bodies in 10 MiB chunks (constants.DOWNLOAD_CHUNK_SIZE,
# read at each download): httpx assembles each chunk by copying, and one write() of 10 MiB
# is slower than ten of 1 MiB where memory bandwidth is scarce. 1 MiB fetched 1.7x faster
# in tests/bench/bench_fetch.py (docs/benchmarks.md); xet downloads are not affected.
_HTTP_CHUNK_BYTES = 1 << 20
_INFO_TIMEOUT_S = 30.0


def fetch_snapshot(
    key: SnapshotKey,
    hub: HubSettings,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
    *,
    refresh: bool = False,
) -> Snapshot:
    """The complete snapshot of ``key``: from the cache when it is complete there (unless
    ``refresh``), else downloaded. Blocking: run it in a thread. Raises
    :class:`DownloadFailed`, or :class:`DownloadCancelled` once ``cancel`` is set."""
    progress = progress or Progress()
    cancel = cancel or threading.Event()
    if not refresh:
        found = cached_snapshot(key, hub)
        if found is not None:
            progress.expect(found.files, found.files)
            return found
    if hub.offline:
        raise DownloadFailed(offline_message(key, hub))
    with hub_errors(key, hub):
        return _download(key, hub, progress, cancel)


def _download(
    key: SnapshotKey, hub: HubSettings, progress: Progress, cancel: threading.Event
) -> Snapshot:
    from huggingface_hub import HfApi

    api = HfApi(
        endpoint=hub.endpoint,
        token=hub.token,
        library_name="sie-worker",
        library_version=__version__,
    )
    info = api.model_info(
        key.repo_id, revision=key.revision, files_metadata=True, timeout=_INFO_TIMEOUT_S
    )
    commit = info.sha
    if not commit or not is_commit(commit):
        raise DownloadFailed(f"{key}: {hub.endpoint} answered without a commit for the revision")
    sizes: dict[str, int | None] = {s.rfilename: s.size for s in info.siblings or []}
    plan = plan_files(sizes, key.weights)
    repo_dir = repo_path(key, hub)
    snapshot_dir = repo_dir / "snapshots" / commit
    if plan.index is not None:  # the shards to fetch are the ones the index names
        index = {plan.index: sizes[plan.index]}
        progress.expect(index, present_files(snapshot_dir, index))
        _fetch_files(key, hub, commit, index, snapshot_dir, progress, cancel)
    shards = read_index(snapshot_dir, plan) if plan.index else frozenset[str]()
    support = {f: sizes[f] for f in plan.support}
    weights = {f: sizes[f] for f in weight_files(plan, sizes, shards)}
    files = {**support, **weights}
    present = present_files(snapshot_dir, files)
    progress.expect(files, present)
    _check_space(key, hub, files, present)
    _fetch_files(key, hub, commit, files, snapshot_dir, progress, cancel)
    missing = missing_files(files, present_files(snapshot_dir, files))
    if missing:
        raise DownloadFailed(
            f"{key}: after the download, {len(missing)} file(s) are missing or have the wrong "
            f"size in {snapshot_dir} ({', '.join(missing[:3])}); the next load retries"
        )
    mark_complete(key, repo_dir, commit, files)
    _log.info("%s: snapshot %s complete (%d files)", key, commit, len(files))
    return Snapshot(snapshot_dir, commit, files, cached=False, downloaded_bytes=progress.fetched)


def _fetch_files(
    key: SnapshotKey,
    hub: HubSettings,
    commit: str,
    files: Mapping[str, int | None],
    snapshot_dir: Path,
    progress: Progress,
    cancel: threading.Event,
) -> None:
    """Download the files not yet in the snapshot, a few at a time. Returns once every
    thread has ended; raises the first failure (the others stop at their next chunk)."""
    from huggingface_hub import constants, hf_hub_download

    constants.DOWNLOAD_CHUNK_SIZE = _HTTP_CHUNK_BYTES
    present = present_files(snapshot_dir, files)
    todo = [f for f in files if f not in present]
    failed = threading.Event()

    def stop() -> bool:
        return cancel.is_set() or failed.is_set()

    def one(path: str) -> None:
        if stop():
            raise Stopped(path)
        hf_hub_download(
            key.repo_id,
            path,
            revision=commit,
            cache_dir=hub.cache_dir,
            endpoint=hub.endpoint,
            token=hub.token,
            library_name="sie-worker",
            library_version=__version__,
            tqdm_class=progress.bar(path, stop),
        )

    if not todo:
        return
    with ThreadPoolExecutor(min(_FILES_AT_ONCE, len(todo)), "sie-fetch") as pool:
        futures = [pool.submit(one, path) for path in todo]
        wait(futures, return_when=FIRST_EXCEPTION)
        failed.set()  # a no-op once all are done; else the rest stop soon
        wait(futures)
    if cancel.is_set():
        raise DownloadCancelled(f"{key}: download cancelled")
    errors = [f.exception() for f in futures if f.exception() is not None]
    real = [e for e in errors if not isinstance(e, Stopped)]
    if real:
        raise real[0]  # type: ignore[misc]


def _check_space(
    key: SnapshotKey,
    hub: HubSettings,
    files: Mapping[str, int | None],
    present: Mapping[str, int | None],
) -> None:
    need = sum(size or 0 for path, size in files.items() if path not in present)
    folder = hub.cache_dir
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return
    if need > free:
        raise DownloadFailed(
            f"{key}: the weights need {need / 1e9:.1f} GB but the model cache "
            f"({hub.cache_dir}) has {free / 1e9:.1f} GB free: give the cache more room "
            "(chart: workers.common.modelCache) or remove other snapshots"
        )
