"""Model weights in the Hugging Face cache: find a complete snapshot, or download one with
huggingface_hub, in a thread, cancellably, with byte progress.

The worker fetches a model's snapshot before it starts the engine and starts the engine
from the local folder (``--model-path <HF_HUB_CACHE>/models--org--name/snapshots/<commit>``);
``sie-worker fetch`` fetches the same way. What is fetched, and when a snapshot is trusted,
is :mod:`sie_worker.worker.weight_files` (pure); this module is the shell around the hub.

- A snapshot that is complete in the cache (a completion record whose files are all there)
  is used without any network request, also with ``HF_HUB_OFFLINE=1``. A cache prepared
  with ``hf download`` is trusted when huggingface_hub's own listing of the commit shows
  every selected file present.
- Otherwise (and never with ``HF_HUB_OFFLINE``/``TRANSFORMERS_OFFLINE``) the revision is
  resolved on ``HF_ENDPOINT`` with ``HF_TOKEN``, the support files and then the weights are
  downloaded (8 files at a time; a dropped connection resumes from the byte it reached, a
  file that arrived earlier is not fetched again), every file is checked, and only then
  the completion record and ``refs/<revision>`` are written.
- Hub failures become :class:`DownloadFailed` (``load_failed``) saying what to do: 401
  gated or unauthorized, 404 repo/revision/file not found, network errors, no space.
- :class:`SnapshotDownloads` runs one download per repo and revision at a time, shared by
  every load waiting for it; when its last waiter is cancelled (unload, shutdown) the
  download stops at its next chunk and its thread ends before the waiter does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import stat as statmod
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sie_worker._version import __version__
from sie_worker.config.model_shape import hf_hub_cache
from sie_worker.errors import LoadFailed
from sie_worker.worker.weight_files import (
    DEFAULT_REVISION,
    MARKER_FOLDER,
    FilePlan,
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

__all__ = [
    "DEFAULT_ENDPOINT",
    "DownloadCancelled",
    "DownloadFailed",
    "DownloadHandle",
    "HubSettings",
    "Progress",
    "Snapshot",
    "SnapshotDownloads",
    "SnapshotKey",
    "cached_snapshot",
    "fetch_snapshot",
]

_log = logging.getLogger("sie_worker.weights")
DEFAULT_ENDPOINT = "https://huggingface.co"
_FILES_AT_ONCE = 8  # as huggingface_hub's snapshot_download
# huggingface_hub reads plain-HTTP bodies in 10 MiB chunks (constants.DOWNLOAD_CHUNK_SIZE,
# read at each download): httpx assembles each chunk by copying, and one write() of 10 MiB
# is slower than ten of 1 MiB where memory bandwidth is scarce. 1 MiB fetched 1.7x faster
# in tests/bench/bench_fetch.py (docs/benchmarks.md); xet downloads are not affected.
_HTTP_CHUNK_BYTES = 1 << 20
_INFO_TIMEOUT_S = 30.0


class DownloadFailed(LoadFailed):
    """The snapshot could not be fetched; the message names the model and the fix."""


class DownloadCancelled(Exception):
    """The download was cancelled (unload, shutdown, Ctrl-C); nothing was marked complete."""


class _Stopped(Exception):
    """Raised inside a file download when its download was cancelled or another file failed."""


@dataclass(frozen=True)
class HubSettings:
    """Where snapshots live and how the hub is reached, from the environment."""

    cache_dir: Path
    endpoint: str = DEFAULT_ENDPOINT
    token: str | None = None
    offline: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> HubSettings:
        endpoint = (env.get("HF_ENDPOINT") or "").strip().rstrip("/") or DEFAULT_ENDPOINT
        token = (env.get("HF_TOKEN") or env.get("HUGGING_FACE_HUB_TOKEN") or "").strip()
        return cls(hf_hub_cache(env), endpoint, token or None, is_offline(env))


@dataclass(frozen=True)
class SnapshotKey:
    """One snapshot: a model repo at a revision (branch, tag or commit)."""

    repo_id: str
    revision: str = DEFAULT_REVISION

    @classmethod
    def of(cls, repo_id: str, revision: str | None) -> SnapshotKey:
        return cls(repo_id, revision or DEFAULT_REVISION)

    def __str__(self) -> str:
        return f"{self.repo_id}@{self.revision}"


@dataclass(frozen=True)
class Snapshot:
    path: Path  # snapshots/<commit>, what the engine gets as --model-path
    commit: str
    files: Mapping[str, int | None]
    cached: bool  # found complete, nothing downloaded
    downloaded_bytes: int = 0


class Progress:
    """Bytes of one snapshot present so far; updated by download threads, read anywhere."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sizes: dict[str, int | None] = {}
        self._done: dict[str, int] = {}
        self.fetched = 0  # bytes that came over the network in this download

    def expect(self, sizes: Mapping[str, int | None], present: Mapping[str, int | None]) -> None:
        """Files to fetch with their sizes; those already present count as done."""
        with self._lock:
            self._sizes.update(sizes)
            for path in sizes:
                if path in present:
                    self._done[path] = present[path] or 0

    @property
    def done(self) -> int:
        with self._lock:
            return bytes_done(self._sizes, self._done)

    @property
    def total(self) -> int | None:
        with self._lock:
            return bytes_total(self._sizes) if self._sizes else None

    def _set(self, path: str, value: int) -> None:
        with self._lock:
            self._done[path] = value

    def _add(self, path: str, n: int) -> None:
        with self._lock:
            self._done[path] = self._done.get(path, 0) + n
            self.fetched += n

    def bar(self, path: str, stop: Callable[[], bool]) -> type:
        """A progress-bar class for huggingface_hub's ``tqdm_class``, counting into this
        object for ``path``. It draws nothing, and stops the download (at its next chunk)
        once ``stop()`` is true."""
        progress = self

        class _Bar:
            total: int | None

            def __init__(self, *args: Any, **kwargs: Any) -> None:
                self.total = kwargs.get("total")
                self.n = int(kwargs.get("initial") or 0)
                progress._set(path, self.n)

            def __enter__(self) -> _Bar:
                return self

            def __exit__(self, *exc: object) -> None:
                return None

            def update(self, n: float | None = 1) -> None:
                if stop():
                    raise _Stopped(path)
                step = int(n or 0)
                self.n += step
                progress._add(path, step)

            # Called by huggingface_hub; having them makes it count each byte once.
            def update_transfer(self, n: float | None = 1) -> None:
                return None

            def set_postfix_str(self, *args: Any, **kwargs: Any) -> None:
                return None

            def set_transfer_postfix_str(self, *args: Any, **kwargs: Any) -> None:
                return None

            def set_description(self, *args: Any, **kwargs: Any) -> None:
                return None

            def set_description_str(self, *args: Any, **kwargs: Any) -> None:
                return None

            def refresh(self, *args: Any, **kwargs: Any) -> None:
                return None

            def close(self) -> None:
                return None

        return _Bar


# --- the cache ---------------------------------------------------------------------------


def _repo_dir(key: SnapshotKey, hub: HubSettings) -> Path:
    return hub.cache_dir / repo_folder(key.repo_id)


def _read_ref(repo_dir: Path, revision: str) -> str | None:
    if revision.startswith("/") or ".." in revision.split("/"):
        return None
    try:
        commit = (repo_dir / "refs" / revision).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return commit if is_commit(commit) else None


def _commit_of(key: SnapshotKey, repo_dir: Path) -> str | None:
    return key.revision if is_commit(key.revision) else _read_ref(repo_dir, key.revision)


def _present(snapshot_dir: Path, paths: Iterable[str]) -> dict[str, int | None]:
    """Sizes of the files that exist in a snapshot folder (symlinks followed)."""
    found: dict[str, int | None] = {}
    for path in paths:
        try:
            stat = (snapshot_dir / path).stat()
        except OSError:
            continue
        if statmod.S_ISREG(stat.st_mode):
            found[path] = stat.st_size
    return found


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _mark_complete(
    key: SnapshotKey, repo_dir: Path, commit: str, files: Mapping[str, int | None]
) -> None:
    """Record the snapshot as complete, then point ``refs/<revision>`` at it (in that
    order: a ref never names a commit whose record is missing)."""
    _write_atomic(
        repo_dir / MARKER_FOLDER / f"{commit}.json", marker_text(key.repo_id, commit, files)
    )
    if not is_commit(key.revision) and _read_ref(repo_dir, key.revision) != commit:
        _write_atomic(repo_dir / "refs" / key.revision, commit)


def cached_snapshot(key: SnapshotKey, hub: HubSettings) -> Snapshot | None:
    """The snapshot of ``key`` when it is complete in the cache, else None. No network."""
    repo_dir = _repo_dir(key, hub)
    commit = _commit_of(key, repo_dir)
    if commit is None:
        return None
    snapshot_dir = repo_dir / "snapshots" / commit
    try:
        marker = (repo_dir / MARKER_FOLDER / f"{commit}.json").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        files = _files_from_hub_listing(key, hub, commit, snapshot_dir)
        if files is None:
            return None
        with contextlib.suppress(OSError):  # a read-only cache stays usable
            _mark_complete(key, repo_dir, commit, files)
        return Snapshot(snapshot_dir, commit, files, cached=True)
    files = parse_marker(marker, key.repo_id, commit)
    if files is None or missing_files(files, _present(snapshot_dir, files)):
        return None
    return Snapshot(snapshot_dir, commit, files, cached=True)


def _files_from_hub_listing(
    key: SnapshotKey, hub: HubSettings, commit: str, snapshot_dir: Path
) -> dict[str, int | None] | None:
    """The selected files of a snapshot huggingface_hub itself fetched completely (``hf
    download`` caches the commit's listing), or None when that cannot be shown."""
    from huggingface_hub import get_cached_repo_tree

    try:
        tree = get_cached_repo_tree(key.repo_id, revision=commit, cache_dir=hub.cache_dir)
    except Exception:  # no listing cached, or an older cache layout: not provable
        return None
    sizes: dict[str, int | None] = {f.path: f.size for f in tree}
    try:
        plan = plan_files(sizes)
        shards = _read_index(snapshot_dir, plan) if plan.index else frozenset[str]()
        wanted = (*plan.support, *weight_files(plan, sizes, shards))
    except (NoWeights, OSError, ValueError):
        return None
    files = {f: sizes[f] for f in wanted}
    return None if missing_files(files, _present(snapshot_dir, files)) else files


def _read_index(snapshot_dir: Path, plan: FilePlan) -> frozenset[str]:
    assert plan.index is not None
    return index_shards(json.loads((snapshot_dir / plan.index).read_text(encoding="utf-8")))


# --- downloading -------------------------------------------------------------------------


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
        raise DownloadFailed(_offline_message(key, hub))
    with _hub_errors(key, hub):
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
    plan = plan_files(sizes)
    repo_dir = _repo_dir(key, hub)
    snapshot_dir = repo_dir / "snapshots" / commit
    if plan.index is not None:  # the shards to fetch are the ones the index names
        index = {plan.index: sizes[plan.index]}
        progress.expect(index, _present(snapshot_dir, index))
        _fetch_files(key, hub, commit, index, snapshot_dir, progress, cancel)
    shards = _read_index(snapshot_dir, plan) if plan.index else frozenset[str]()
    support = {f: sizes[f] for f in plan.support}
    weights = {f: sizes[f] for f in weight_files(plan, sizes, shards)}
    files = {**support, **weights}
    present = _present(snapshot_dir, files)
    progress.expect(files, present)
    _check_space(key, hub, files, present)
    _fetch_files(key, hub, commit, files, snapshot_dir, progress, cancel)
    missing = missing_files(files, _present(snapshot_dir, files))
    if missing:
        raise DownloadFailed(
            f"{key}: after the download, {len(missing)} file(s) are missing or have the wrong "
            f"size in {snapshot_dir} ({', '.join(missing[:3])}); the next load retries"
        )
    _mark_complete(key, repo_dir, commit, files)
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
    present = _present(snapshot_dir, files)
    todo = [f for f in files if f not in present]
    failed = threading.Event()

    def stop() -> bool:
        return cancel.is_set() or failed.is_set()

    def one(path: str) -> None:
        if stop():
            raise _Stopped(path)
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
    real = [e for e in errors if not isinstance(e, _Stopped)]
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


def _offline_message(key: SnapshotKey, hub: HubSettings) -> str:
    repo_dir = _repo_dir(key, hub)
    commit = _commit_of(key, repo_dir)
    snapshots = repo_dir / "snapshots"
    if commit is not None and (snapshots / commit).is_dir():
        state = (
            f"its snapshot {commit} in {hub.cache_dir} is incomplete (a download stopped "
            "halfway, or it was not fetched by sie-worker or hf download)"
        )
    elif commit is None and snapshots.is_dir() and any(snapshots.iterdir()):
        state = (
            f"the model cache {hub.cache_dir} holds only an incomplete snapshot of it (a "
            f"download stopped halfway; {key.revision!r} is recorded once one completes)"
        )
    else:
        state = f"it is not in the model cache {hub.cache_dir}"
    return (
        f"{key}: HF_HUB_OFFLINE is set and {state}; run `sie-worker fetch` where the hub is "
        "reachable (chart: workers.common.prefetch), or unset HF_HUB_OFFLINE"
    )


@contextlib.contextmanager
def _hub_errors(key: SnapshotKey, hub: HubSettings) -> Iterator[None]:
    """Translate what huggingface_hub, httpx and the disk raise into :class:`DownloadFailed`."""
    import httpx
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = hub.endpoint
    try:
        yield
    except (DownloadFailed, DownloadCancelled):
        raise
    except NoWeights as exc:
        raise DownloadFailed(f"{key} {exc}; point hf_id at a repo in one of those formats") from exc
    except GatedRepoError as exc:
        status = _status(exc)
        token = "HF_TOKEN is not set" if hub.token is None else "the HF_TOKEN account has no access"
        raise DownloadFailed(
            f"{key}: {status} from {where}: the repo is gated and {token}; accept the model's "
            "terms on the Hub with an account, and set HF_TOKEN to its token "
            "(chart: workers.common.hfToken)"
        ) from exc
    except RevisionNotFoundError as exc:
        raise DownloadFailed(
            f"{key}: {_status(exc)} from {where}: the repo has no revision {key.revision!r}; "
            "fix revision (hf_revision) in the model config"
        ) from exc
    except RemoteEntryNotFoundError as exc:
        raise DownloadFailed(
            f"{key}: {_status(exc)} from {where}: a file of the revision's listing is not "
            f"there ({exc.response.url if exc.response is not None else '?'}); retry later"
        ) from exc
    except RepositoryNotFoundError as exc:
        status = _status(exc)
        why = (
            "the repo does not exist, or it is private and HF_TOKEN is missing or has no access"
            if status.startswith("401")
            else "no such repo"
        )
        raise DownloadFailed(
            f"{key}: {status} from {where}: {why}; check hf_id in the model config "
            "(private repos need HF_TOKEN, chart: workers.common.hfToken)"
        ) from exc
    except HfHubHTTPError as exc:
        raise DownloadFailed(
            f"{key}: {_status(exc)} from {where}; the hub refused the download, the next load "
            "retries"
        ) from exc
    except OfflineModeIsEnabled as exc:
        raise DownloadFailed(_offline_message(key, hub)) from exc
    except httpx.HTTPError as exc:
        raise DownloadFailed(
            f"{key}: could not download from {where} ({type(exc).__name__}: {exc}); check "
            "HF_ENDPOINT and that the pod may reach it (networkPolicy.egress); the next load "
            "retries"
        ) from exc
    except OSError as exc:
        raise DownloadFailed(
            f"{key}: {type(exc).__name__} while writing the model cache {hub.cache_dir}: {exc}"
        ) from exc


def _status(exc: Any) -> str:
    response = getattr(exc, "response", None)
    code = getattr(response, "status_code", None)
    if code is None:
        return "an error"
    reason = getattr(response, "reason_phrase", "") or ""
    return f"{code} {reason}".strip()


# --- shared downloads (async) -------------------------------------------------------------


@dataclass(eq=False)
class _Download:
    key: SnapshotKey
    future: asyncio.Future[Snapshot]
    progress: Progress
    cancel: threading.Event
    waiters: int = 0


@dataclass(eq=False)
class DownloadHandle:
    """One load's share of a download; :meth:`result` waits for the snapshot."""

    _owner: SnapshotDownloads = field(repr=False)
    _download: _Download

    @property
    def progress(self) -> Progress:
        return self._download.progress

    async def result(self) -> Snapshot:
        download = self._download
        try:
            return await asyncio.shield(download.future)
        except asyncio.CancelledError:
            if download.waiters == 1 and not download.future.done():
                # The last waiter leaves: stop the download and wait for its thread, so no
                # file is still being written when the caller moves on.
                download.cancel.set()
                await asyncio.wait([download.future])
            raise
        finally:
            download.waiters -= 1


class SnapshotDownloads:
    """Snapshot fetches in threads: one per repo and revision at a time, shared by every
    load that needs it."""

    def __init__(self, hub: HubSettings, *, parallel: int = 4) -> None:
        self.hub = hub
        self._active: dict[SnapshotKey, _Download] = {}
        self._executor = ThreadPoolExecutor(parallel, "sie-download")

    def join(self, key: SnapshotKey) -> DownloadHandle:
        """Join the download of ``key``, starting it when none runs."""
        download = self._active.get(key)
        if download is None:
            progress, cancel = Progress(), threading.Event()
            loop = asyncio.get_running_loop()
            future = loop.run_in_executor(
                self._executor, fetch_snapshot, key, self.hub, progress, cancel
            )
            download = _Download(key, future, progress, cancel)
            self._active[key] = download
            future.add_done_callback(lambda _: self._forget(download))
        download.waiters += 1
        return DownloadHandle(self, download)

    def _forget(self, download: _Download) -> None:
        if self._active.get(download.key) is download:
            del self._active[download.key]
        if not download.future.cancelled():
            download.future.exception()  # retrieved: failures are reported to the waiters

    async def aclose(self) -> None:
        """Stop every download and wait for their threads."""
        active = list(self._active.values())
        for download in active:
            download.cancel.set()
        if active:
            await asyncio.wait([d.future for d in active])
        # Idle now: its threads end at once, and are gone when this returns.
        await asyncio.get_running_loop().run_in_executor(None, self._executor.shutdown)
